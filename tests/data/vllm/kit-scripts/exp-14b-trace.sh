# Run 18b (issue 13): run 18's Qwen2.5-14B shape traced. vLLM's torch profiler (the operator's --profiler-config,
# kube/manifests.py:profiler_config, 64 iterations) on slices of closed loops of 1,024/256 at c8, c32 and c128 (decode
# steps at 8-128 sequences, the mixed prefill+decode steps of the waves), so the simulator's step model can be held to a
# shape none of its fits saw. Engine with the operator's flags (engine-args-14b.txt) and run 18's tokenizer workaround.
# Every load its own seed (1821 on); results packed after each.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r18b; mkdir -p $R; t0=$(date +%s); rm -rf /tmp/prof
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
pack() { tar czf $OUT/trace14-results.tgz -C /tmp r18b; }
python3 $S/make_qwen14b.py
PC=$(python3 -c "import kneepoint.kube.manifests as m; m.PROFILES_DIR='/tmp/prof'; print(m.profiler_config())" 2>/dev/null) || \
  PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true,"max_iterations":64}'
echo "$PC" > $R/profiler-config.txt
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-14b.txt) --load-format dummy --tokenizer /tmp/k/models/tok-qwen-152k --profiler-config "$PC" > $R/serve-14b.log 2>&1 & srv=$!
up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "14b up=$up"
M=Qwen2.5-14B-Instruct; W="--api completions --input-len 1024 --output-len 256"
LG() { n=$1; lim=$2; shift 2; [ $(el) -gt $lim ] && { T "skip $n"; return; }
  timeout 100 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M $W --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
trace() { n=$1
  for i in $(seq 1 60); do s1=$(du -sb /tmp/prof 2>/dev/null | cut -f1); sleep 1; s2=$(du -sb /tmp/prof 2>/dev/null | cut -f1); [ "$s1" = "$s2" ] && [ "${s1:-0}" -gt 100000 ] && break; done
  big=$(ls -S /tmp/prof/*.gz 2>/dev/null | head -1)
  if [ -n "$big" ]; then python3 $S/steps_from_trace.py "$big" > $R/steps-$n.txt 2>&1; sz=$(stat -c %s "$big"); echo "$n trace $big $sz bytes" >> $R/traces.txt
    [ "$sz" -lt 20000000 ] && cp "$big" $R/trace-$n.json.gz; fi
  rm -rf /tmp/prof; T "trace $n done"; pack; }
if [ $up = 1 ]; then
  LG c32p 380 --seed 1821 --concurrency 32 --num-requests 96 --warmup-requests 32 --profile-seconds 4 --profile-requests 32; trace c32p
  LG c8p 440 --seed 1822 --concurrency 8 --num-requests 24 --warmup-requests 8 --profile-seconds 2 --profile-requests 8; trace c8p
  LG c128p 480 --seed 1823 --concurrency 128 --num-requests 256 --warmup-requests 128 --profile-seconds 4 --profile-requests 128; trace c128p
fi
kill $srv; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
