# realfit captures (issue 13's last misses): per-request records at c1/c32-operator/c64/c128 (and c4/c8/c16), vLLM's own
# request histograms (/metrics before and after each load), a 0.2 s running/waiting sampler on a second c128, and a profiled
# slice at c64 (steps table). One 8B engine, the operator's flags (engine-args-realfit.txt, from kube/manifests.py:vllm_args,
# --max-num-seqs 128), every load its own seed. The load generator: this checkout's (operator/kneepoint), else the kit's.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r3; mkdir -p $R /tmp/prof; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
if PYTHONPATH=$PWD/operator:$PYTHONPATH python3 -c "import kneepoint.loadgen.command, kneepoint.loadgen.runner, kneepoint.loadgen.worker_pool, kneepoint.loadgen.http_client, kneepoint.loadgen.sse, kneepoint.loadgen.summary, kneepoint.loadgen.profile_slice, psutil" 2>$R/main-loadgen-check.txt && PYTHONPATH=$PWD/operator:$PYTHONPATH python3 -m kneepoint loadgen --help >/dev/null 2>>$R/main-loadgen-check.txt; then
  export PYTHONPATH=$PWD/operator:$PYTHONPATH; echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
else echo "loadgen: the kit's copy (checkout's failed, main-loadgen-check.txt)" > $R/loadgen-source.txt; fi
cat $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
python3 -c "import vllm, torch, aiohttp; print('vllm', vllm.__version__, 'torch', torch.__version__, 'aiohttp', aiohttp.__version__)" > $R/versions.txt 2>&1
ARGS=$(cat $S/engine-args-realfit.txt); echo "$ARGS" > $R/engine-args.txt
PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true}'
python3 -m vllm.entrypoints.cli.main serve $ARGS --load-format dummy --profiler-config "$PC" > $R/serve.log 2>&1 & srv=$!
up=0; for i in $(seq 1 280); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "up=$up"
M() { curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(time_to_first_token|request_queue_time|request_prefill_time|request_decode_time|e2e_request_latency|request_inference_time|inter_token_latency|iteration_tokens|num_preemptions|prompt_tokens_total|generation_tokens_total|prefix_cache)' > $R/metrics-$1.txt; }
LG() { n=$1; shift; M before-$n; timeout 170 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model Llama-3.1-8B-Instruct --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; M after-$n; T "loadgen $n done"; }
pack() { tar czf $OUT/realfit-results.tgz -C /tmp r3; }
if [ $up = 1 ]; then
  W="--api completions --input-len 1024 --output-len 256"
  LG c32-operator $W --seed 1234 --concurrency 32 --num-requests 200 --warmup-requests 10 --repeats 2
  LG c128 $W --seed 34 --concurrency 128 --num-requests 512 --warmup-requests 64
  LG c64 $W --seed 33 --concurrency 64 --num-requests 256 --warmup-requests 32
  LG c1 $W --seed 31 --concurrency 1 --num-requests 64 --warmup-requests 2
  pack
  ( while kill -0 $srv 2>/dev/null; do ts=$(date +%s.%N); curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:num_requests_(running|waiting)' | sed "s/^/$ts /"; sleep 0.2; done ) > $R/samples-c128b.txt 2>&1 & smp=$!
  LG c128b $W --seed 36 --concurrency 128 --num-requests 512 --warmup-requests 64
  kill $smp 2>/dev/null
  LG c64b $W --seed 35 --concurrency 64 --num-requests 256 --warmup-requests 32 --profile-seconds 2 --profile-requests 192
  f=$(ls -t /tmp/prof/*.gz 2>/dev/null | head -1); [ -n "$f" ] && { ( python3 $S/steps_from_trace.py "$f" > $R/steps-c64.txt 2>&1 ) & spid=$!; [ $(stat -c %s "$f") -lt 15000000 ] && cp "$f" $OUT/trace-c64.json.gz; }
  [ $(el) -lt 470 ] && LG c16 $W --seed 39 --concurrency 16 --num-requests 96 --warmup-requests 10
  [ $(el) -lt 490 ] && LG c8 $W --seed 38 --concurrency 8 --num-requests 48 --warmup-requests 8
  [ $(el) -lt 505 ] && LG c4 $W --seed 37 --concurrency 4 --num-requests 24 --warmup-requests 4
  [ -n "${spid:-}" ] && wait $spid
  curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt
fi
pack
kill $srv; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
