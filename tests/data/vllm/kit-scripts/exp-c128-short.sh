# Run 40 (issue 13): 128 short sequences decoding between waves of 128-token prompts. The simulator's TPOT of the 8B's
# 128/128 loads at c128 is 5-6.5 % short on both GPUs (run 9 on the H200, runs 28-29 on an H100), and on the H200 that
# load's decode steps seen by the client (7.1-7.7 ms) are 8-11 % above the model's, where every stamped decode step of
# the engine (runs 20-39) is within 3-6 %; no engine stamps exist of that load. Here each engine given runs, stamped
# (stage_trace), the same load (128/128 c128, a warm-up wave and three measured), one wave of 128/512 at c128 and
# 128/128 at c64; then, unstamped, the load generator with run 9's p128-c128 flags (a second take of that capture);
# the host's launch and per-vCPU probes (run 39's) before the first engine.
# `exp-c128-short.sh RUN:ARGS_FILE...` (run 40: r40:engine-args-realfit.txt r40b:engine-args-8b-fp8.txt).
# Run 41: r41:engine-args-8b-fp8.txt, then the 14B fp8 after make_qwen14b.py with r41b:engine-args-14b-fp8-tok.txt (the
# script makes no model folder and names no tokenizer: tests/data/vllm/README.md, "Run 41").
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export PYTHONPATH=$PWD/operator:$PYTHONPATH
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
P=/tmp/probe; mkdir -p $P
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > $P/gpu.txt 2>&1
lscpu > $P/lscpu.txt 2>&1
timeout 60 python3 $S/launch_probe.py > $P/launch.jsonl 2> $P/launch.err
timeout 90 python3 $S/host_probe.py > $P/host.jsonl 2> $P/host.err
tar czf $OUT/probe-results.tgz -C /tmp probe
pack() { tar czf $OUT/$RUN-results.tgz -C /tmp $RUN 2>/dev/null; }
engine() {  # engine RUN ARGS_FILE
  RUN=$1 ARGS=$2
  R=/tmp/$RUN; mkdir -p $R/st
  T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
  echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
  cp $S/$ARGS $R/
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
  lscpu > $R/lscpu.txt 2>&1
  M=$(sed 's/.*--served-model-name \([^ ]*\).*/\1/' $S/$ARGS); export KP_MODEL_NAME=$M
  KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy > $R/serve-$RUN.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN up=$up"; pack
  if [ $up = 1 ]; then
    CL() { n=$1; shift; T "start $n"; timeout 60 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done"; }
    CL warm 1 1 2 0 128 16 4000
    touch $R/st/on; sleep 0.5
    # stage_client: LABEL STREAM CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED
    CL c128-p128 1 128 384 128 128 128 4001
    CL c128-d 1 128 128 0 128 512 4002
    CL c64-p128 1 64 192 64 128 128 4003
    rm -f $R/st/on; sleep 0.5; pack
    T "loadgen start"
    timeout 90 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --api completions --max-error-fraction 1.0 --no-progress \
      --input-len 128 --output-len 128 --concurrency 128 --num-requests 512 --warmup-requests 128 --seed 4010 --save-json $R/lg-p128-c128.json > $R/lg-p128-c128.txt 2>&1
    echo "rc=$?" >> $R/lg-p128-c128.txt; T "loadgen done"
  fi
  kill $srv 2>/dev/null; for j in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN end"; pack
}
for spec in "$@"; do engine ${spec%%:*} ${spec#*:}; done
ls -la $OUT
