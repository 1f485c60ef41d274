# Run 23: how far real vLLM's repeats of one load test lie apart, and --expect on real vLLM.
# One 8B engine with the operator's flags for deploy/examples/experiment.yaml at TP1 (run23-engine-args.txt), then
# the load-test Job's own flags (run23-loads.txt, both written by make_run23_args.py): each workload once with five
# repeats and once as predict-first's Job would run it (two repeats, --expect from the operator's prediction).
# Usage: exp-repeats.sh [TAG]: run23TAG-engine-args.txt and run23TAG-loads.txt (runs 23b, 23c: other workloads).
set -u
TAG=${1:-}
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
export PYTHONPATH=$PWD/operator:$PYTHONPATH
R=/tmp/r23$TAG; mkdir -p $R; t0=$(date +%s)
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint, with the working tree's changes" > $R/loadgen-source.txt
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
cp $S/run23$TAG-engine-args.txt $S/run23$TAG-loads.txt $R/
lscpu > $R/lscpu.txt 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
ARGS=$(cat $S/run23$TAG-engine-args.txt)
python3 -m vllm.entrypoints.cli.main serve $ARGS --load-format dummy > $R/serve.log 2>&1 & srv=$!
up=0; for i in $(seq 1 280); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "up=$up"
pack() { curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt; tar czf $OUT/run23$TAG-results.tgz -C /tmp r23$TAG; }
if [ $up = 1 ]; then
  while read -r name args; do
    [ -n "$name" ] || continue
    T "loadgen $name start"
    TERMINATION_MESSAGE_PATH=$R/lg-$name.termination.json timeout 400 python3 -m kneepoint loadgen $args \
      --save-json $R/lg-$name.json > $R/lg-$name.txt 2>&1
    echo "rc=$?" >> $R/lg-$name.txt
    T "loadgen $name done"
    pack
  done < $S/run23$TAG-loads.txt
fi
pack
kill $srv; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done
ls -la $OUT; T end
