# Run 38 (issue 13): the EngineCore's launches and a wave's steps, model by model on one host. A pipelined model of
# vLLM's loop (the next step launched while the GPU runs the last, a wave handed in by the API server's loop) needs each
# model's launch of a prefill inside the CUDA graphs (runs 20, 21, 33: 6-11 ms alone, the 1B's never stamped) and its
# waves on one host. Here the 1B, the 8B fp8 and the 14B fp8 one after the other: stamped lone 128-token prompts (c1,
# 8 after one warm-up, 64 out) and closed loops of 128/256 at c8 and c32, stamps on; no profiler.
# `exp-lone-waves.sh RUN:ARGS_FILE...` (run 38: r38:engine-args-1b.txt r38b:engine-args-8b-fp8.txt
# r38c:engine-args-14b-fp8.txt).
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export PYTHONPATH=$PWD/operator:$PYTHONPATH
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
pack() { tar czf $OUT/$RUN-results.tgz -C /tmp $RUN 2>/dev/null; }  # one archive an engine: two traces each stay under 16 MiB
PC=$(python3 -c "import kneepoint.kube.manifests as m; m.PROFILES_DIR='/tmp/prof'; print(m.profiler_config())" 2>/dev/null) || \
  PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true,"max_iterations":64}'
engine() {  # engine RUN ARGS_FILE
  RUN=$1 ARGS=$2
  R=/tmp/$RUN; mkdir -p $R/st; rm -rf /tmp/prof
  T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
  echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
  cp $S/$ARGS $R/; echo "$PC" > $R/profiler-config.txt
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
  lscpu > $R/lscpu.txt 2>&1
  grep -q llama-3.2-1b $S/$ARGS && python3 $S/make_llama1b.py
  EXTRA=""; if grep -q qwen2.5-14b $S/$ARGS; then python3 $S/make_qwen14b.py > $R/make-model.txt 2>&1; EXTRA="--tokenizer /tmp/k/models/tok-qwen-152k"; fi
  M=$(sed 's/.*--served-model-name \([^ ]*\).*/\1/' $S/$ARGS); export KP_MODEL_NAME=$M
  KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy $EXTRA --profiler-config "$PC" > $R/serve-$RUN.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN up=$up"; pack
  if [ $up = 1 ]; then
    CL() { n=$1; shift; T "start $n"; timeout 40 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done"; }
    CL warm 1 1 2 0 128 16 3800
    touch $R/st/on; sleep 0.5
    # stage_client: LABEL STREAM CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED
    CL c1-p128 1 1 8 1 128 64 3801
    CL c8 1 8 24 8 128 256 3802
    CL c32 1 32 96 32 128 256 3803
    rm -f $R/st/on; sleep 0.5; pack
  fi
  kill $srv 2>/dev/null; for j in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN end"; pack
}
for spec in "$@"; do engine ${spec%%:*} ${spec#*:}; done
ls -la $OUT
