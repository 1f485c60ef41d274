# Run 33 (issue 13): is run 32's finding the 14B's or fp8's? Run 32 stamped a lone 1,024-token prompt on Qwen2.5-14B's
# shape with online fp8 on an H100: 32.7 ms from the step's plan to its token where its GEMMs take 23.3 ms and the
# model's step 24.6. The same on the 8B with online fp8 (engine-args-8b-fp8.txt, run 12b's and 28-29's engine): a
# lone 1,024/256 load (run33-loads.txt, seed 3301, stamps off), then 8 stamped lone 1,024-token prompts (64 out) and
# 8 lone 128-token ones. `exp-8b-fp8-lone.sh [RUN]`.
set -u
RUN=${1:-r33}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export KP_MODEL_NAME=Llama-3.1-8B-Instruct
export PYTHONPATH=$PWD/operator:$PYTHONPATH
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
pack() { tar czf $OUT/$RUN-results.tgz -C /tmp $RUN 2>/dev/null; }
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
cp $S/engine-args-8b-fp8.txt $S/run33-loads.txt $R/
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-8b-fp8.txt) --load-format dummy > $R/serve-$RUN.log 2>&1 & srv=$!
up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$RUN up=$up"; pack
if [ $up = 1 ]; then
  CL() { n=$1; shift; T "start $n"; timeout 40 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done"; }
  CL warm 1 1 2 0 128 16 3320
  while read -r name args; do
    [ -n "$name" ] || continue
    T "loadgen $name start"
    TERMINATION_MESSAGE_PATH=$R/lg-$name.termination.json timeout 50 python3 -m kneepoint loadgen $args --save-json $R/lg-$name.json > $R/lg-$name.txt 2>&1
    echo "rc=$?" >> $R/lg-$name.txt
    T "loadgen $name done $(grep -o '"ttftP50Ms": [0-9.]*' $R/lg-$name.json | head -1)"
  done < $S/run33-loads.txt
  pack
  touch $R/st/on; sleep 0.5
  # stage_client: LABEL STREAM CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED
  CL c1 1 1 8 1 1024 64 3321
  CL c1-p128 1 1 8 1 128 64 3322
  rm -f $R/st/on
fi
kill $srv 2>/dev/null; for j in $(seq 1 10); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$RUN end"; pack; ls -la $OUT
