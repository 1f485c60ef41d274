# run 8 (issue 13): how a burst of short prompts reaches real vLLM's engine, and the time to first token by prompt
# length on the 1B. Run 6's 128-token loads start each measured phase with a burst of c requests; real vLLM gave the
# first of them its first token 51-124 ms (8B) and 26-130 ms (1B) after the send where a lone request takes 17 and
# 11 ms, so the API server's per-request intake is partly serial, which the simulator (2.1 us per prompt token serial,
# 0.27 ms for 128 tokens) does not have. Here: bursts of N = 1..128 requests of 128 tokens (16-token replies, closed
# loop with --concurrency N --num-requests N, no warm-up), two each; c1 TTFT at 256-768 tokens (8B: the step just
# above vLLM's largest CUDA graph, 256 tokens) and 16-3,584 tokens (1B); after every load vLLM's own TTFT, queue and
# prefill histograms' sums and counts from /metrics (server-side times beside the client's).
# Engines with the operator's flags (engine-args-realfit.txt, engine-args-1b.txt, as runs 3-7). Every load its own seed.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r8; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
pack() { tar czf $OUT/burst-results.tgz -C /tmp r8; }
python3 - <<'PY'
import json, shutil
src, dst = "/tmp/k/models/llama-3-8b", "/tmp/k/models/llama-3.2-1b"
shutil.copytree(src, dst, dirs_exist_ok=True)
c = json.load(open(f"{src}/config.json"))
c.update(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
         num_hidden_layers=16, tie_word_embeddings=True)
c["rope_scaling"]["factor"] = 32.0
json.dump(c, open(f"{dst}/config.json", "w"), indent=1)
PY
serve() { name=$1; shift; python3 -m vllm.entrypoints.cli.main serve "$@" --load-format dummy > $R/serve-$name.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$name up=$up"; }
stop() { kill $srv 2>/dev/null; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done; kill -9 $srv 2>/dev/null; sleep 2; }
M() { curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(time_to_first_token_seconds|request_queue_time_seconds|request_prefill_time_seconds|request_inference_time_seconds|e2e_request_latency_seconds)_(sum|count)' | sed "s/^/$1 /" >> $R/server-metrics.txt; }
LG() { n=$1; m=$2; shift 2; [ $(el) -gt 540 ] && { T "skip $n"; return; }
  timeout 60 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $m --api completions --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; M $n; T "loadgen $n done"; }
run_bursts() { p=$1; m=$2; L=$3; shift 3; for N in "$@"; do for k in a b; do
  LG $p-burst-$L-n$N$k $m --input-len $L --output-len 16 --seed $seed --concurrency $N --num-requests $N --warmup-requests 0; seed=$((seed+1)); sleep 0.3; done; done; }
seed=801
serve 8b $(cat $S/engine-args-realfit.txt)
if [ $up = 1 ]; then
  m=Llama-3.1-8B-Instruct; M 8b-start
  LG 8b-warm $m --input-len 128 --output-len 16 --seed 800 --concurrency 1 --num-requests 2 --warmup-requests 0
  run_bursts 8b $m 128 1 2 4 8 16 32 64 128
  pack
  for L in 256 320 384 448 512 768; do LG 8b-c1-p$L $m --input-len $L --output-len 16 --seed $seed --concurrency 1 --num-requests 8 --warmup-requests 2; seed=$((seed+1)); done
fi
grep -E "Available KV|GPU KV cache size|weights took|Model loading took|init engine|torch.compile takes|cudagraph" $R/serve-8b.log > $R/serve-8b-lines.txt
stop; pack
serve 1b $(cat $S/engine-args-1b.txt)
if [ $up = 1 ]; then
  m=Llama-3.2-1B-Instruct; M 1b-start
  LG 1b-warm $m --input-len 128 --output-len 16 --seed 850 --concurrency 1 --num-requests 2 --warmup-requests 0
  run_bursts 1b $m 128 1 4 16 64 128
  pack
  for L in 16 128 256 512 1024 2048 3584; do LG 1b-c1-p$L $m --input-len $L --output-len 16 --seed $seed --concurrency 1 --num-requests 8 --warmup-requests 2; seed=$((seed+1)); done
  run_bursts 1b $m 1024 8 32
fi
grep -E "Available KV|GPU KV cache size|weights took|Model loading took|init engine|torch.compile takes|cudagraph" $R/serve-1b.log > $R/serve-1b-lines.txt
stop; T end; pack; ls -la $OUT
