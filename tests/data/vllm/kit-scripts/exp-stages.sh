# Run 19 (issue 13): where a request of the 1B's closed loops waits before its first token. Runs 15-17 showed real
# vLLM keeps the load generator's waves (a request that arrives while a wave decodes waits 74-116 ms) and that it
# is neither the tokenizer nor the engine's queue; the simulator's requests get their first token after ~22 ms.
# stage_trace/sitecustomize.py stamps each request inside vLLM 0.24 (API server: handler, tokenized, add_request,
# sent to the EngineCore, first output received; EngineCore: input thread, busy loop, scheduled, first token) on
# time.time(); stage_client.py sends the closed loops with X-Request-Id so the stamps join. Stamps are kept only
# while $R/st/on exists: c32 runs before and after with them off measure what the stamps cost.
# Run 19: the 1B with the operator's flags (engine-args-1b.txt), prompts of 1,024 tokens, 256 out, as runs 15-17.
# Run 20 (`exp-stages.sh 8b`): the same loads on the 8B (engine-args-realfit.txt), whose steps are the GPU's.
# Run 21 (`exp-stages.sh 14b`): the same on Qwen2.5-14B's shape (engine-args-14b.txt, run 18's tokenizer folder):
# its decode steps unprofiled, where run 18b's trace at 8 sequences ran above the load's whole TPOT.
# Run 22 (`exp-stages.sh 70b-fp8`): the 70B in fp8 (engine-args-70b-fp8.txt: --max-num-seqs 64), its decode steps
# unprofiled at 1, 8, 32 and 64 sequences; replies of 64 tokens (its steps are 20-30 ms), no c128.
set -u
M=${1:-1b}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
EXTRA=""
if [ $M = 8b ]; then RUN=r20 ARGS=engine-args-realfit.txt SEED=2000; export KP_MODEL_NAME=Llama-3.1-8B-Instruct
elif [ $M = 70b-fp8 ]; then RUN=r22 ARGS=engine-args-70b-fp8.txt SEED=2200; export KP_MODEL_NAME=Llama-3.1-70B-Instruct
elif [ $M = 14b ]; then RUN=r21 ARGS=engine-args-14b.txt SEED=2100 EXTRA="--tokenizer /tmp/k/models/tok-qwen-152k"; export KP_MODEL_NAME=Qwen2.5-14B-Instruct
else RUN=r19 ARGS=engine-args-1b.txt SEED=1900; export KP_MODEL_NAME=Llama-3.2-1B-Instruct; fi
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
pack() { tar czf $OUT/stages-results.tgz -C /tmp $RUN; }
[ $M = 14b ] && python3 $S/make_qwen14b.py
[ $M = 1b ] && python3 $S/make_llama1b.py
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy $EXTRA > $R/serve-$M.log 2>&1 & srv=$!
up=0; for i in $(seq 1 360); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$M up=$up"; pack
[ $up = 1 ] || exit 0
snap() { curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(time_to_first_token|request_queue_time|request_prefill_time|e2e_request_latency|iteration_tokens)' > $R/m-$1.txt; }
CL() { n=$1; shift; snap $n-before; T "start $n"; timeout 120 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done $(head -c 200 $R/cl-$n.txt)"; snap $n-after; }
CL warm 1 1 2 0 1024 16 $((SEED + 0))
if [ $M = 70b-fp8 ]; then
  touch $R/st/on; sleep 0.5
  CL c1 1 1 6 1 1024 64 $((SEED + 2))
  CL c8 1 8 16 8 1024 64 $((SEED + 3))
  CL c32 1 32 32 32 1024 64 $((SEED + 4))
  CL c64 1 64 64 64 1024 64 $((SEED + 6))
  kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
  T end; pack; ls -la $OUT; exit 0
fi
CL off-c32-a 1 32 160 32 1024 256 $((SEED + 1))
touch $R/st/on; sleep 0.5
CL c1 1 1 12 1 1024 256 $((SEED + 2))
if [ $M != 1b ]; then  # runs 20-21: lone prompts of other lengths (a step in a CUDA graph; one twice as large)
  CL c1-p128 1 1 8 1 128 64 $((SEED + 10))
  CL c1-p2048 1 1 8 1 2048 128 $((SEED + 11))
fi
CL c8 1 8 64 8 1024 256 $((SEED + 3))
CL c32 1 32 160 32 1024 256 $((SEED + 4))
pack
CL c32-nostream 0 32 160 32 1024 256 $((SEED + 5))
CL c128 1 128 256 128 1024 256 $((SEED + 6))
CL c32-p128 1 32 160 32 128 256 $((SEED + 7))
CL c32-b 1 32 160 32 1024 256 $((SEED + 8))
rm -f $R/st/on; sleep 1
CL off-c32-b 1 32 160 32 1024 256 $((SEED + 9))
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
