# Run 30 (issue 13): gemm_by_rows.py on another GPU type (asked for on an H100: the H200's table, runs 12/12b, is what
# compute.fp8GemmRowFactors holds, and runs 28-29 showed the H100's 8B fp8 decode step adding about half the H200's time
# from 16 to 24 sequences where the model adds the same share of more weight bytes). The rows of runs 12 and 12b
# together (1-16, every size vLLM's CUDA graphs pad a step to up to 256, the CUTLASS tile edges 17/65/129, and
# prefill sizes to 8,192), the 8B's and the 70B's shapes at TP 1, fp8 and bf16. `exp-gemm-rows-gpu.sh [RUN]`.
set -u
RUN=${1:-r30}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
R=/tmp/$RUN; mkdir -p $R; t0=$(date +%s)
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" > $R/versions.txt 2>&1
KP_ROWS=1,8,16,17,24,32,40,48,56,64,65,72,80,88,96,104,112,120,128,129,136,144,160,192,224,256,512,1024,2048,4096,8192 \
KP_SHAPES=8b:1,70b:1 timeout 500 python3 $S/gemm_by_rows.py $R/gemm-by-rows.jsonl > $R/gemm.log 2>&1
echo "rc=$? after $(( $(date +%s) - t0 )) s" >> $R/gemm.log
tar czf $OUT/$RUN-results.tgz -C /tmp $RUN; cat $R/gpu.txt $R/versions.txt; tail -3 $R/gemm.log; wc -l $R/gemm-by-rows.jsonl
