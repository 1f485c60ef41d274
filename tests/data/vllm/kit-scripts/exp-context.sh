# Run 14 (issue 13): does vLLM's CPU time per decode step grow with the context? The 1B's 1024/256 loads at c8-c32 run
# 0.8-1.4 ms a step slower than the CPU floor (fitted to 128/512 loads) in every run, while its c1 loads span the
# host's speeds (run 13). Here: decode loads (256-token replies) with 128-, 1,024- and 2,048-token prompts at c8 and
# c32 (and c128 at 128 and 1,024), each preceded by a c1 reference (128/512) that measures the host's speed at that
# moment; two passes in opposite orders. Then two profiled slices (c32 with 128- and 2,048-token prompts) whose
# per-step kernel sums say whether the extra time is the GPU's or the host's. The 1B with the operator's flags
# (engine-args-1b.txt) and the operator's --profiler-config (idle until /start_profile).
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
R=/tmp/r14; mkdir -p $R; t0=$(date +%s); rm -rf /tmp/prof
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
pack() { tar czf $OUT/context-results.tgz -C /tmp r14; }
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
T "1b up=$up"; pack
[ $up = 1 ] || exit 0
M=Llama-3.2-1B-Instruct
seed=1400
LG() { n=$1; shift; seed=$((seed + 1)); T "start $n"; timeout 60 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress --api completions --seed $seed "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done $(grep -o '"tpotMeanMs": [0-9.]*' $R/lg-$n.json | head -1)"; }
ref() { LG ref-$1 --input-len 128 --output-len 512 --concurrency 1 --num-requests 3 --warmup-requests 1; }
ld() { p=$1; c=$2; k=$3; LG p$p-c$c-$k --input-len $p --output-len 256 --concurrency $c --num-requests $((2 * c)) --warmup-requests $c; }
i=0
for pc in "128 8" "1024 8" "2048 8" "128 32" "1024 32" "2048 32" "128 128" "1024 128"; do
  i=$((i + 1)); ref a$i; ld $pc a
done
pack
for pc in "2048 32" "1024 32" "128 32" "2048 8" "1024 8" "128 8"; do
  i=$((i + 1)); ref b$i; ld $pc b
done
ref b$((i + 1)); pack
LGP() { n=$1; shift; rm -rf /tmp/prof; seed=$((seed + 1)); T "start $n"; timeout 100 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress --api completions --seed $seed "$@" --save-json $R/lgp-$n.json > $R/lgp-$n.txt 2>&1; echo "rc=$?" >> $R/lgp-$n.txt
  for j in $(seq 1 30); do s1=$(du -sb /tmp/prof 2>/dev/null | cut -f1); sleep 1; s2=$(du -sb /tmp/prof 2>/dev/null | cut -f1); [ "$s1" = "$s2" ] && [ "${s1:-0}" -gt 100000 ] && break; done
  big=$(ls -S /tmp/prof/*.gz 2>/dev/null | head -1); [ -n "$big" ] && python3 $S/kernels_by_step.py "$big" > $R/kernels-$n.txt 2>&1
  T "profiled $n done"; }
[ $(el) -lt 420 ] && LGP c32-p128 --input-len 128 --output-len 256 --concurrency 32 --num-requests 64 --warmup-requests 32 --profile-seconds 0.5 --profile-requests 64
[ $(el) -lt 480 ] && LGP c32-p2048 --input-len 2048 --output-len 256 --concurrency 32 --num-requests 64 --warmup-requests 32 --profile-seconds 0.5 --profile-requests 64
grep -E "Available KV|GPU KV cache size|weights took|Model loading took|init engine" $R/serve-1b.log > $R/serve-1b-lines.txt
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
