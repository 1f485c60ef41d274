# Run 28 (issue 13): second takes of the short-prompt captures that had one take each, so the benchmark's spread column
# and floor know how far real vLLM repeats them (the 8B's run 6 and run 9 loads of 128- and 256-token prompts, the 8B
# fp8's run 12 loads), then the 8B's and the 8B fp8's synchronized waves of 128-token prompts stamped inside vLLM
# (stage_trace/sitecustomize.py, stage_client.py as in runs 19-22): where a wave's first ~30 ms go before its first
# token, where a lone request takes ~17 ms. Loads: run28-loads.txt / run28b-loads.txt (make_run28_loads.py: the
# captures' own load-generator flags, new seeds), stamps off; then stamped closed loops, stamps on.
# Engines: the captures' own (engine-args-realfit.txt; engine-args-8b-fp8.txt), one after the other.
# `exp-retakes.sh [RUN_8B RUN_FP8]`: the runs' folder names (run 28: r28 r28b; run 29, the same again: r29 r29b).
set -u
RA=${1:-r28} RB=${2:-r28b}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export KP_MODEL_NAME=Llama-3.1-8B-Instruct
export PYTHONPATH=$PWD/operator:$PYTHONPATH
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
pack() { tar czf $OUT/$RA-results.tgz -C /tmp $RA $RB 2>/dev/null; }
engine() {  # engine RUN ARGS_FILE LOADS_FILE SEED STAMPED_LOADS...
  RUN=$1 ARGS=$2 LOADS=$3 SEED=$4; shift 4
  R=/tmp/$RUN; mkdir -p $R/st
  T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
  echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
  cp $S/$ARGS $S/$LOADS $R/
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
  lscpu > $R/lscpu.txt 2>&1
  KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy > $R/serve-$RUN.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN up=$up"; pack
  if [ $up = 1 ]; then
    CL() { n=$1; shift; T "start $n"; timeout 60 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done"; }
    CL warm 1 1 2 0 128 16 $SEED
    while read -r name args; do
      [ -n "$name" ] || continue
      T "loadgen $name start"
      TERMINATION_MESSAGE_PATH=$R/lg-$name.termination.json timeout 90 python3 -m kneepoint loadgen $args --save-json $R/lg-$name.json > $R/lg-$name.txt 2>&1
      echo "rc=$?" >> $R/lg-$name.txt
      T "loadgen $name done"
    done < $S/$LOADS
    pack
    touch $R/st/on; sleep 0.5
    for spec in "$@"; do CL $spec; done
    rm -f $R/st/on; curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt 2>/dev/null
  fi
  kill $srv 2>/dev/null; for j in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN end"; pack
}
# stage_client: LABEL STREAM CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED
engine $RA engine-args-realfit.txt run28-loads.txt 2820 "c16 1 16 48 16 128 512 2821" "c128 1 128 128 128 128 512 2822"
engine $RB engine-args-8b-fp8.txt run28b-loads.txt 2870 "c8 1 8 16 8 128 256 2871" "c48 1 48 96 48 128 256 2872"
ls -la $OUT
