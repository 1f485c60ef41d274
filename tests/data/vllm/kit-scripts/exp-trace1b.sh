# 1B step anatomy (issue 13): run 6a showed the 1B's decode step period at about 1.5 ms with 128-token prompts and about
# 2.6 ms with 1024-token prompts, at c1 as at c8-c64, while the 8B's changes by 0.1 ms. A half-second profiled slice of
# each (vLLM's torch profiler, CUDA graphs on, as served): c1 1024/256, c1 128/512, c8 1024/256, to see whether the extra
# millisecond is GPU time (which kernel) or time the GPU waits. 1B engine with the operator's flags (engine-args-1b.txt)
# and the operator's --profiler-config (kube/manifests.py:profiler_config, with this machine's trace folder).
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r6c; mkdir -p $R; t0=$(date +%s); rm -rf /tmp/prof
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
pack() { tar czf $OUT/trace1b-results.tgz -C /tmp r6c; }
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
PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true,"max_iterations":64}'
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-1b.txt) --load-format dummy --profiler-config "$PC" > $R/serve-1b.log 2>&1 & srv=$!
up=0; for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "1b up=$up"
M=Llama-3.2-1B-Instruct
LGP() { n=$1; shift; rm -rf /tmp/prof; timeout 100 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt
  for i in $(seq 1 20); do s1=$(du -sb /tmp/prof 2>/dev/null | cut -f1); sleep 1; s2=$(du -sb /tmp/prof 2>/dev/null | cut -f1); [ "$s1" = "$s2" ] && [ "${s1:-0}" -gt 100000 ] && break; done
  big=$(ls -S /tmp/prof/*.gz 2>/dev/null | head -1); [ -n "$big" ] && cp "$big" $R/trace-$n.json.gz
  [ -n "$big" ] && python3 $S/steps_from_trace.py "$big" > $R/steps-$n.txt 2>&1
  T "loadgen $n done"; pack; }
if [ $up = 1 ]; then
  LGP c1-1024 --api completions --input-len 1024 --output-len 256 --seed 631 --concurrency 1 --num-requests 4 --warmup-requests 1 --profile-seconds 0.5 --profile-requests 3
  [ $(el) -lt 400 ] && LGP c1-128 --api completions --input-len 128 --output-len 512 --seed 632 --concurrency 1 --num-requests 3 --warmup-requests 1 --profile-seconds 0.5 --profile-requests 2
  [ $(el) -lt 450 ] && LGP c8-1024 --api completions --input-len 1024 --output-len 256 --seed 633 --concurrency 8 --num-requests 32 --warmup-requests 8 --profile-seconds 0.5 --profile-requests 24
fi
kill $srv 2>/dev/null; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
