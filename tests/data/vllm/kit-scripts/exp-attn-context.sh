# Run 42 (issue 13): the decode attention kernel alone by context (attn_by_context.py), on whatever GPU comes.
# Runs 40-41's decode steps at 128 sequences rise with the context more slowly than the model's KV read (0.77-0.80 of
# it in three engines) and in steps at 256, 384 and 512 tokens; this times vLLM 0.24's FlashAttention 3 call alone
# to tell the kernel's shape from the rest of the step. `exp-attn-context.sh [RUN]` (run 42: r42).
set -u
RUN=${1:-r42}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
R=/tmp/$RUN; mkdir -p $R; t0=$(date +%s)
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version --format=csv > $R/gpu.txt 2>&1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" > $R/versions.txt 2>&1
timeout 420 python3 $S/attn_by_context.py > $R/attn-by-context.jsonl 2> $R/attn.err
echo "rc=$? after $(( $(date +%s) - t0 )) s" >> $R/attn.err
tar czf $OUT/$RUN-results.tgz -C /tmp $RUN; cat $R/gpu.txt $R/versions.txt; tail -3 $R/attn.err; grep -c '"attn"' $R/attn-by-context.jsonl; grep -m3 error $R/attn-by-context.jsonl
