# run 10 (issue 13): the 70B with online fp8 is the one model whose TTFT at c16 the simulator misses (-31 % to -37 %, runs
# 5 and 6b) while its c1 TTFT and its decode step are within 8 %; no 70B step had been traced. Here vLLM's torch profiler
# (the operator's --profiler-config, kube/manifests.py:profiler_config, 64 iterations, this machine's trace folder) on a
# slice of c16 1024/256 (the mixed prefill+decode steps) and of c1 (a lone 1,024-token prefill, decode at batch 1), then
# unprofiled loads of the same workload at c4, c8 and c16 again (new points and the repeat spread). Engine with the
# operator's flags (deploy/examples/large-model.yaml with dtype fp8, kube.manifests.vllm_args: engine-args-70b-fp8.txt,
# as runs 5 and 6b). Every load its own seed (1001 on); results packed after each.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r10; mkdir -p $R; t0=$(date +%s); rm -rf /tmp/prof
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
pack() { tar czf $OUT/trace70-results.tgz -C /tmp r10; }
# the builder's output if the operator's package imports here, else the same text as the builder prints it
PC=$(python3 -c "import kneepoint.kube.manifests as m; m.PROFILES_DIR='/tmp/prof'; print(m.profiler_config())" 2>/dev/null) || \
  PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true,"max_iterations":64}'
echo "$PC" > $R/profiler-config.txt
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-70b-fp8.txt) --load-format dummy --profiler-config "$PC" > $R/serve-70b-fp8.log 2>&1 & srv=$!
up=0; for i in $(seq 1 330); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "70b-fp8 up=$up"
M=Llama-3.1-70B-Instruct; W="--api completions --input-len 1024 --output-len 256"
metrics() { curl -s http://127.0.0.1:8000/metrics | grep -E "^vllm:(time_to_first_token|request_queue_time|request_prefill_time|inter_token_latency|request_decode_time)_seconds_(sum|count)" > $R/metrics-after-$1.txt; }
LG() { n=$1; lim=$2; shift 2; [ $(el) -gt $lim ] && { T "skip $n"; return; }
  timeout 150 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M $W --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt
  metrics $n; T "loadgen $n done"; }
trace() { n=$1
  for i in $(seq 1 60); do s1=$(du -sb /tmp/prof 2>/dev/null | cut -f1); sleep 1; s2=$(du -sb /tmp/prof 2>/dev/null | cut -f1); [ "$s1" = "$s2" ] && [ "${s1:-0}" -gt 100000 ] && break; done
  big=$(ls -S /tmp/prof/*.gz 2>/dev/null | head -1)
  if [ -n "$big" ]; then python3 $S/steps_from_trace.py "$big" > $R/steps-$n.txt 2>&1; sz=$(stat -c %s "$big"); echo "$n trace $big $sz bytes" >> $R/traces.txt
    [ "$sz" -lt 30000000 ] && cp "$big" $R/trace-$n.json.gz; fi
  rm -rf /tmp/prof; T "trace $n done"; pack; }
if [ $up = 1 ]; then
  curl -s http://127.0.0.1:8000/metrics | grep -E "^vllm:cache_config_info" > $R/cache-config-70b-fp8.txt
  LG c16p 400 --seed 1001 --concurrency 16 --num-requests 48 --warmup-requests 16 --profile-seconds 4 --profile-requests 32; trace c16p
  LG c1p 440 --seed 1002 --concurrency 1 --num-requests 3 --warmup-requests 1 --profile-seconds 2 --profile-requests 2; trace c1p
  LG c4 470 --seed 1003 --concurrency 4 --num-requests 16 --warmup-requests 4; pack
  LG c16b 490 --seed 1004 --concurrency 16 --num-requests 48 --warmup-requests 16; pack
  LG c8 520 --seed 1005 --concurrency 8 --num-requests 24 --warmup-requests 8
fi
grep -E "Available KV|GPU KV cache size|Maximum concurrency|weights took|Model loading took|init engine|torch.compile takes|max_num_batched_tokens|chunked|capture" $R/serve-70b-fp8.log | head -40 > $R/serve-lines.txt
kill $srv; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
