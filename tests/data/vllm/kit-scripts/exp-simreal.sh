# simreal captures (issue 13): one 8B engine (operator flags, --max-num-seqs 128, profiler configured), sweep, long prompts,
# chat near maxModelLen, API probes, raw streams, profiling overhead, traces at c8/c128, then a second start on a kept compile cache.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r; mkdir -p $R /tmp/prof; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export VLLM_CACHE_ROOT=/tmp/vcache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
python3 -c "import vllm, torch, transformers, aiohttp; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'aiohttp', aiohttp.__version__)" > $R/versions.txt 2>&1
ARGS=$(cat $S/engine-args.txt); echo "$ARGS" > $R/engine-args.txt
PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true}'
start() { python3 -m vllm.entrypoints.cli.main serve $ARGS --load-format dummy --profiler-config "$PC" > $R/$1.log 2>&1 & srv=$!; s0=$(date +%s)
  up=0; for i in $(seq 1 280); do [ $(el) -gt 575 ] && break; curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$1 up=$up healthy after $(( $(date +%s) - s0 )) s"; }
LG() { n=$1; shift; timeout 150 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model Llama-3.1-8B-Instruct --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
prof() { curl -s -X POST http://127.0.0.1:8000/start_profile -o /dev/null -w "start_profile %{http_code}" | tee -a $R/timeline.txt; T ""; sleep 3
  curl -s -X POST http://127.0.0.1:8000/stop_profile -o /dev/null -w "stop_profile %{http_code}" | tee -a $R/timeline.txt; T " ($1)"
  f=; for i in $(seq 1 60); do f=$(ls -t /tmp/prof/*.gz 2>/dev/null | head -1); if [ -n "$f" ]; then a=$(stat -c %s $f); sleep 1; [ "$a" = "$(stat -c %s $f)" ] && break; else sleep 1; fi; done
  [ -n "$f" ] && { mv "$f" /tmp/trace-$1.json.gz; ( python3 $S/steps_from_trace.py /tmp/trace-$1.json.gz > $R/steps-$1.txt 2>&1 ) & } ; rm -f /tmp/prof/*.txt; }
start serve-1
if [ $up = 1 ]; then
  curl -s http://127.0.0.1:8000/metrics > $R/metrics-idle.txt
  python3 $S/probes.py $R/api-probes.txt; T probes
  python3 $S/stream_capture.py /v1/completions '{"model":"Llama-3.1-8B-Instruct","prompt":"the of and","max_tokens":1500,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' $R/stream-completion-c1.jsonl
  python3 $S/stream_capture.py /v1/chat/completions '{"model":"Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"the of"}],"max_tokens":400,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' $R/stream-chat-c1.jsonl
  T streams
  W="--api completions --input-len 1024 --output-len 256 --seed 1234"
  LG c1 $W --concurrency 1 --num-requests 8 --warmup-requests 2
  LG c4 $W --concurrency 4 --num-requests 24 --warmup-requests 4
  LG c8 $W --concurrency 8 --num-requests 48 --warmup-requests 8
  LG c16 $W --concurrency 16 --num-requests 96 --warmup-requests 10
  LG c64 $W --concurrency 64 --num-requests 256 --warmup-requests 32
  LG c128 $W --concurrency 128 --num-requests 512 --warmup-requests 64
  LG long-c16 --api completions --input-len 3584 --output-len 128 --seed 9 --concurrency 16 --num-requests 64 --warmup-requests 8
  LG chat-c8 --api chat --input-len 3800 --output-len 256 --seed 5 --concurrency 8 --num-requests 32 --warmup-requests 4
  # profiling overhead: the same c32 load without, then with a 3 s profiled slice 8 s in
  LG c32-noprof $W --concurrency 32 --num-requests 400 --warmup-requests 10
  ( LG c32-prof $W --concurrency 32 --num-requests 400 --warmup-requests 10 ) & lg=$!
  sleep 9; prof c32; wait $lg
  ( LG c128-prof $W --concurrency 128 --num-requests 640 --warmup-requests 0 --seed 77 ) & lg=$!
  sleep 8; prof c128; wait $lg
  if [ $(el) -lt 420 ]; then ( LG c8-prof $W --concurrency 8 --num-requests 64 --seed 78 ) & lg=$!; sleep 5; prof c8; wait $lg; fi
  curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt
fi
desc() { for c in $(pgrep -P $1); do echo $c; desc $c; done; }
stop() { kids=$(desc $srv); kill -TERM $srv 2>/dev/null; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done; kill -KILL $srv $kids 2>/dev/null; sleep 2; }
pack() { tar czf $OUT/simreal-results.tgz -C /tmp r; }
stop; wait; pack
if [ $(el) -lt 480 ]; then start serve-2-cached; stop; fi
du -sh /tmp/vcache >> $R/timeline.txt 2>&1; ls -la /tmp/trace-*.gz >> $R/timeline.txt 2>&1
pack
s=$(ls -S /tmp/trace-c8.json.gz 2>/dev/null | head -1); [ -n "$s" ] && [ $(stat -c %s $s) -lt 15000000 ] && cp $s $OUT/trace-c8.json.gz
ls -la $OUT; T end
