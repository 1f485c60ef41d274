# run 12b (issue 13): (1) gemm_by_rows.py again at every batch size vLLM's CUDA graphs pad a decode step to (multiples
# of 8 up to 256) for the 70B and 8B shapes at TP 1: run 12 showed fp8's CUTLASS kernels 30-50 % slower at 17-32 and
# 65-128 rows than at 16, and 2.7x at 129; (2) a held-out check of that on a model and dtype never captured: the 8B
# with online fp8 (the operator's flags for deploy/examples/experiment.yaml with dtype fp8 and --max-num-seqs 128,
# engine-args-8b-fp8.txt), decode-dominated loads (128-token prompts, 256-token replies: TPOT is the decode step) at
# c8-c128, then 1,024/256 at c32. Every load its own seed (1201 on); results packed after each.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r12b; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
pack() { tar czf $OUT/r12b-results.tgz -C /tmp r12b; }
KP_ROWS=8,16,24,32,40,48,56,64,72,80,88,96,104,112,120,128,136,144,160,192,224,256 KP_SHAPES=70b:1,8b:1 \
  timeout 100 python3 $S/gemm_by_rows.py $R/gemm-by-rows-padded.jsonl > $R/gemm.log 2>&1; echo "rc=$?" >> $R/gemm.log
T "gemm done"; pack
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-8b-fp8.txt) --load-format dummy > $R/serve-8b-fp8.log 2>&1 & srv=$!
up=0; for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "8b-fp8 up=$up"
M=Llama-3.1-8B-Instruct
LG() { n=$1; lim=$2; shift 2; [ $(el) -gt $lim ] && { T "skip $n"; return; }
  timeout 60 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --api completions --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt
  T "loadgen $n done"; pack; }
if [ $up = 1 ]; then
  curl -s http://127.0.0.1:8000/metrics | grep -E "^vllm:cache_config_info" > $R/cache-config-8b-fp8.txt
  s=1201
  for c in 8 16 24 32 40 48 64 96 128; do
    LG d-c$c 400 --input-len 128 --output-len 256 --seed $s --concurrency $c --num-requests $((2*c)) --warmup-requests $c; s=$((s+1))
  done
  LG c32 430 --input-len 1024 --output-len 256 --seed 1211 --concurrency 32 --num-requests 96 --warmup-requests 32
fi
grep -E "Available KV|GPU KV cache size|weights took|Model loading took|init engine|max_num_batched_tokens|cudagraph|compile" $R/serve-8b-fp8.log | head -30 > $R/serve-lines.txt
kill $srv; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT; cat $R/timeline.txt
