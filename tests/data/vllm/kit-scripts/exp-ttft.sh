# time to first token at c1 by prompt and reply length (issue 13): run 6's 8B gave 17.0 ms for a 128-token prompt with
# 512-token replies where runs 2-3 gave 32.0 ms for 1,024 tokens with 256-token replies, which no intake of a fixed
# part plus a non-negative per-token part fits under the modelled prefill. Here one 8B engine (the operator's flags,
# engine-args-realfit.txt, as runs 3-6): c1 loads of prompts of 16 to 3,584 tokens with 16-token replies, then
# prompts of 128 and 1,024 tokens with 16, 256 and 512-token replies, each 2 warm-up + 8 measured, its own seed.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r7; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
pack() { tar czf $OUT/ttft-results.tgz -C /tmp r7; }
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-realfit.txt) --load-format dummy > $R/serve.log 2>&1 & srv=$!
up=0; for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "up=$up"
LG() { n=$1; shift; timeout 60 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model Llama-3.1-8B-Instruct --api completions --concurrency 1 --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
if [ $up = 1 ]; then
  seed=701
  for L in 16 64 128 256 512 1024 2048 3584; do
    LG p$L-o16 --input-len $L --output-len 16 --seed $seed --num-requests 8 --warmup-requests 2; seed=$((seed+1))
  done
  pack
  for L in 128 1024; do for O in 256 512; do
    LG p$L-o$O --input-len $L --output-len $O --seed $seed --num-requests 8 --warmup-requests 2; seed=$((seed+1))
  done; done
fi
kill $srv 2>/dev/null; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
