# simreal captures, run 2: every load with its own seed (run 1 reused seed 1234 across runs, so vLLM's prefix cache served
# repeated prompts). One 8B engine, operator flags with --max-num-seqs 128, profiler configured (inactive unless started).
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r2; mkdir -p $R /tmp/prof; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
ARGS=$(cat $S/engine-args.txt); echo "$ARGS" > $R/engine-args.txt
PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true}'
python3 -m vllm.entrypoints.cli.main serve $ARGS --load-format dummy --profiler-config "$PC" > $R/serve.log 2>&1 & srv=$!
up=0; for i in $(seq 1 280); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "up=$up"
LG() { n=$1; shift; timeout 150 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model Llama-3.1-8B-Instruct --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
pack() { curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt; tar czf $OUT/simreal-results-2.tgz -C /tmp r2; }
if [ $up = 1 ]; then
  W="--api completions --input-len 1024 --output-len 256"
  LG c32-operator $W --seed 1234 --concurrency 32 --num-requests 200 --warmup-requests 10 --repeats 2
  LG c1 $W --seed 11 --concurrency 1 --num-requests 8 --warmup-requests 2
  LG c4 $W --seed 12 --concurrency 4 --num-requests 24 --warmup-requests 4
  LG c8 $W --seed 13 --concurrency 8 --num-requests 48 --warmup-requests 8
  LG c16 $W --seed 14 --concurrency 16 --num-requests 96 --warmup-requests 10
  LG c64 $W --seed 16 --concurrency 64 --num-requests 256 --warmup-requests 32
  LG c128 $W --seed 17 --concurrency 128 --num-requests 512 --warmup-requests 64
  pack
  LG c32-noprof $W --seed 21 --concurrency 32 --num-requests 400 --warmup-requests 10
  ( LG c32-prof $W --seed 22 --concurrency 32 --num-requests 400 --warmup-requests 10 ) & lg=$!
  sleep 9
  curl -s -X POST http://127.0.0.1:8000/start_profile -o /dev/null -w "start_profile %{http_code}" | tee -a $R/timeline.txt; T ""; sleep 3
  curl -s -X POST http://127.0.0.1:8000/stop_profile -o /dev/null -w "stop_profile %{http_code}" | tee -a $R/timeline.txt; T ""
  wait $lg
fi
pack
kill $srv; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done
ls -la $OUT; T end
