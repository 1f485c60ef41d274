# run 11 (issue 13): held-out workloads for the 70B with online fp8 after run 10's fit of fp8's rate (fitted to 1,024-token
# prefills and c1 TTFT only): long prompts (2,048/128 c4; 4,096/256 c8: chunked prefill across requests), short prompts at
# c16 (512/256: a wave fits one 8,192-token step) and a decode-heavy c32 (256/512). Engine with the operator's flags
# (engine-args-70b-fp8.txt, as runs 5, 6b and 10), no profiler. Every load its own seed (1101 on); results packed after each.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r11; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
pack() { tar czf $OUT/heldout70-results.tgz -C /tmp r11; }
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-70b-fp8.txt) --load-format dummy > $R/serve-70b-fp8.log 2>&1 & srv=$!
up=0; for i in $(seq 1 330); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "70b-fp8 up=$up"
M=Llama-3.1-70B-Instruct
LG() { n=$1; lim=$2; shift 2; [ $(el) -gt $lim ] && { T "skip $n"; return; }
  timeout 120 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --api completions --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt
  T "loadgen $n done"; pack; }
if [ $up = 1 ]; then
  LG p2048-c4 420 --input-len 2048 --output-len 128 --seed 1101 --concurrency 4 --num-requests 16 --warmup-requests 4
  LG p512-c16 440 --input-len 512 --output-len 256 --seed 1102 --concurrency 16 --num-requests 48 --warmup-requests 16
  LG p4096-c8 460 --input-len 4096 --output-len 256 --seed 1103 --concurrency 8 --num-requests 16 --warmup-requests 8
  LG p256-c32 500 --input-len 256 --output-len 512 --seed 1104 --concurrency 32 --num-requests 64 --warmup-requests 32
fi
grep -E "Available KV|GPU KV cache size|weights took|Model loading took|init engine|max_num_batched_tokens" $R/serve-70b-fp8.log | head -20 > $R/serve-lines.txt
kill $srv; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
