# Run 44 (issue 13): long prompts at c16, stamped inside vLLM 0.24 as runs 19-22 (stage_trace/sitecustomize.py).
# Run 23's 8B 6,144/256 c16 loads and run 18's 14B 3,584/128 c16 load get their first tokens a prefill step sooner
# than the simulator's from the second round on (docs/simulator.md, "The intake's gate at 0.85 ms"): which step a
# request sent when another finished joins. The stamps tell when each such request reaches the EngineCore and
# which step schedules it; lone prompts of 4,096 and 6,144 tokens give the intake of a long prompt (runs 19-21
# stamped 128 to 2,048). `exp-long-stages.sh 8b` (run 44: run 23c's engine, engine-args-8b-long.txt, and the
# H200 attention kernel of exp-attn-context.sh first) or `exp-long-stages.sh 14b` (run 44b: run 18's engine).
set -u
M=${1:-8b}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
EXTRA=""
if [ $M = 14b ]; then RUN=r44b ARGS=engine-args-14b.txt SEED=4410 IN=3584 OUTL=128 NUM=80 EXTRA="--tokenizer /tmp/k/models/tok-qwen-152k"; export KP_MODEL_NAME=Qwen2.5-14B-Instruct
else RUN=r44 ARGS=engine-args-8b-long.txt SEED=4400 IN=6144 OUTL=256 NUM=176; export KP_MODEL_NAME=Llama-3.1-8B-Instruct; fi
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
pack() { tar czf $OUT/$RUN-results.tgz -C /tmp $RUN $( [ -d /tmp/r43 ] && echo r43 ); }
if [ $M = 8b ]; then
  # run 43: the decode attention kernel alone, on this GPU (run 42's came on an H100)
  mkdir -p /tmp/r43; cp $R/gpu.txt /tmp/r43/
  timeout 120 python3 $S/attn_by_context.py > /tmp/r43/attn-by-context.jsonl 2> /tmp/r43/attn.err; echo "rc=$?" >> /tmp/r43/attn.err
  T "attn done $(grep -c '"attn"' /tmp/r43/attn-by-context.jsonl)"
fi
[ $M = 14b ] && python3 $S/make_qwen14b.py
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy $EXTRA > $R/serve-$M.log 2>&1 & srv=$!
up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$M up=$up"; pack
[ $up = 1 ] || { tail -30 $R/serve-$M.log; exit 0; }
snap() { curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(time_to_first_token|request_queue_time|request_prefill_time|e2e_request_latency|iteration_tokens)' > $R/m-$1.txt; }
CL() { n=$1; shift; snap $n-before; T "start $n"; timeout 200 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done $(head -c 200 $R/cl-$n.txt)"; snap $n-after; }
CL warm 1 1 2 0 $IN 16 $((SEED + 0))
touch $R/st/on; sleep 0.5
CL c1-p$IN 1 1 6 1 $IN 64 $((SEED + 1))
[ $M = 8b ] && CL c1-p4096 1 1 6 1 4096 64 $((SEED + 2))
pack
CL c16-long 1 16 $NUM 16 $IN $OUTL $((SEED + 3))
rm -f $R/st/on
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
