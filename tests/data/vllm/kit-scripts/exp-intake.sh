# intake captures (issue 13: how a burst of requests reaches real vLLM's engine): bursts of N requests sent at once
# (closed loop, --concurrency N --num-requests N, no warm-up) at N = 1..64 with 1024-token prompts, N = 1, 4, 8, 16 with 256-
# and 3584-token prompts, short outputs (16 tokens) so each burst is its intake and prefills; then three more c128 and one more
# c64 of the 1024/256 workload (c128's TTFT P50 is bistable on real vLLM: how often each regime comes). One 8B engine, the
# operator's flags (engine-args-realfit.txt, from kube/manifests.py:vllm_args, --max-num-seqs 128), every load its own seed.
# The load generator: this checkout's operator/kneepoint.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r4; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
python3 -c "import vllm, torch, aiohttp; print('vllm', vllm.__version__, 'torch', torch.__version__, 'aiohttp', aiohttp.__version__)" > $R/versions.txt 2>&1
ARGS=$(cat $S/engine-args-realfit.txt); echo "$ARGS" > $R/engine-args.txt
python3 -m vllm.entrypoints.cli.main serve $ARGS --load-format dummy > $R/serve.log 2>&1 & srv=$!
up=0; for i in $(seq 1 280); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "up=$up"
LG() { n=$1; shift; timeout 120 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model Llama-3.1-8B-Instruct --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
pack() { tar czf $OUT/intake-results.tgz -C /tmp r4; }
if [ $up = 1 ]; then
  # one unmeasured request first: the engine's first request after start is slower (lazy set-up)
  LG warm --api completions --input-len 1024 --output-len 16 --seed 400 --concurrency 1 --num-requests 2 --warmup-requests 0
  seed=401
  for N in 1 2 4 8 16 32 64; do for k in a b; do
    LG burst-1024-n$N$k --api completions --input-len 1024 --output-len 16 --seed $seed --concurrency $N --num-requests $N --warmup-requests 0; seed=$((seed+1)); sleep 0.5
  done; done
  for L in 256 3584; do for N in 1 4 8 16; do
    LG burst-$L-n$N --api completions --input-len $L --output-len 16 --seed $seed --concurrency $N --num-requests $N --warmup-requests 0; seed=$((seed+1)); sleep 0.5
  done; done
  pack
  W="--api completions --input-len 1024 --output-len 256"
  for k in c d e; do [ $(el) -lt 420 ] && LG c128$k $W --seed $seed --concurrency 128 --num-requests 512 --warmup-requests 64; seed=$((seed+1)); done
  [ $(el) -lt 470 ] && LG c64c $W --seed $seed --concurrency 64 --num-requests 256 --warmup-requests 32
fi
pack
kill $srv; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
