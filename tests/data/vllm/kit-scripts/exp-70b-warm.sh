# 70B with online fp8 (issue 13): run 5's c16 had no warm-up and its TTFT P50 was 30 % above the simulator's; here c16 of
# the same 1024/256 workload after 16 warm-up requests, c1 again, and the example's 2048/512 workload at c64, which did
# not fit run 5's call. Engine with the operator's flags (engine-args-70b-fp8.txt, as run 5). Every load its own seed.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r6b; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
pack() { tar czf $OUT/warm70-results.tgz -C /tmp r6b; }
serve() { name=$1; shift; python3 -m vllm.entrypoints.cli.main serve "$@" --load-format dummy > $R/serve-$name.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 330); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$name up=$up"; }
LG() { n=$1; m=$2; shift 2; timeout 90 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $m --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
serve 70b-fp8 $(cat $S/engine-args-70b-fp8.txt)
if [ $up = 1 ]; then
  M=Llama-3.1-70B-Instruct; W="--api completions --input-len 1024 --output-len 256"
  LG 70b-fp8-c16w $M $W --seed 621 --concurrency 16 --num-requests 48 --warmup-requests 16
  pack
  [ $(el) -lt 440 ] && LG 70b-fp8-c1b $M $W --seed 622 --concurrency 1 --num-requests 3 --warmup-requests 1
  [ $(el) -lt 450 ] && LG 70b-fp8-c64x $M --api completions --input-len 2048 --output-len 512 --seed 623 --concurrency 64 --num-requests 64 --warmup-requests 0
  curl -s http://127.0.0.1:8000/metrics | grep -E "^vllm:cache_config_info" > $R/cache-config-70b-fp8.txt
fi
grep -E "Available KV|GPU KV cache size|Maximum concurrency|weights took|Model loading took|init engine|torch.compile takes" $R/serve-70b-fp8.log > $R/serve-lines.txt
kill $srv; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
