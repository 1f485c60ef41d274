# Run 18 (issues 13 and 18): a held-out architecture and size. Qwen2.5-14B's shape (Qwen2: 48 layers, hidden 5,120,
# 40 heads / 8 KV heads, biased QKV, a 152,064-token vocabulary) in bf16 on one H200, with the operator's own flags
# (engine-args-14b.txt: the manifest builder's for the example experiment with model Qwen/Qwen2.5-14B-Instruct),
# none of it fitted: the simulator's decode, prefill and intake were fitted to Llama shapes (8B, 1B, 70B fp8).
# Closed loops as the operator's Job runs them (warm-up, then the measured phase), every load its own seed (1801 on).
# The start-up is timed twice: cold, then restarted with the same VLLM_CACHE_ROOT (torch.compile cached), as a tier
# started again with the compile cache on the model-cache volume (issue 18's cost model has only the 8B's).
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r18; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH VLLM_CACHE_ROOT=/tmp/vcache
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
pack() { tar czf $OUT/r18-results.tgz -C /tmp r18; }
python3 $S/make_qwen14b.py  # the model folder and its tokenizer folder (as first written inline in this script)
M=Qwen2.5-14B-Instruct
serve() { name=$1; T "serve $name start"; python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-14b.txt) --load-format dummy --tokenizer /tmp/k/models/tok-qwen-152k > $R/serve-$name.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$name up=$up"; curl -s http://127.0.0.1:8000/metrics > $R/metrics-$name.txt; pack; }
stop() { kill $srv 2>/dev/null; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done; kill -9 $srv 2>/dev/null; sleep 2; T "stopped"; }
seed=1800
LG() { n=$1; shift; seed=$((seed + 1)); [ $(el) -gt 535 ] && { T "skip $n"; return; }
  T "start $n"; timeout 80 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress --api completions --seed $seed "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done $(grep -o '"ttftP50Ms": [0-9.]*' $R/lg-$n.json | head -1)"; }
W="--input-len 1024 --output-len 256"
serve cold
[ $up = 1 ] || { pack; exit 0; }
curl -s http://127.0.0.1:8000/tokenize -H 'Content-Type: application/json' -d "{\"model\": \"$M\", \"prompt\": \"the of and to in\"}" > $R/tokenize.json; T "tokenize $(head -c 200 $R/tokenize.json)"
LG c1 $W --concurrency 1 --num-requests 8 --warmup-requests 1
LG c8 $W --concurrency 8 --num-requests 48 --warmup-requests 8
LG c32 $W --concurrency 32 --num-requests 128 --warmup-requests 32
LG d-c16 --input-len 128 --output-len 512 --concurrency 16 --num-requests 48 --warmup-requests 16
LG c64 $W --concurrency 64 --num-requests 256 --warmup-requests 64
LG long-c16 --input-len 3584 --output-len 128 --concurrency 16 --num-requests 64 --warmup-requests 16
pack
LG c128 $W --concurrency 128 --num-requests 384 --warmup-requests 128
pack
stop
serve cached
[ $up = 1 ] && { LG r-c32 $W --concurrency 32 --num-requests 128 --warmup-requests 32; LG r-c8 $W --concurrency 8 --num-requests 48 --warmup-requests 8; LG r-c1 $W --concurrency 1 --num-requests 8 --warmup-requests 1; }
stop; T end; pack; ls -la $OUT
