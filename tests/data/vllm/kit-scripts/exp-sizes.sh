# model sizes (issue 13: the simulator is calibrated on the 8B alone; other sizes use the same efficiencies on their own bytes
# and FLOPs): a Llama-3.2-1B shape (bf16) and a Llama-3.1-70B shape with vLLM's online fp8 quantization, each at TP1 on one H200,
# each with the operator's flags from kube/manifests.py:vllm_args (engine-args-1b.txt: deploy/examples/experiment.yaml with the
# model and preset changed, --max-num-seqs 128; engine-args-70b-fp8.txt: deploy/examples/large-model.yaml with dtype fp8).
# The 1B folder is the kit's 8B one with the 1B preset's shape. Every load its own seed; results packed after each step.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r5; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
pack() { tar czf $OUT/sizes-results.tgz -C /tmp r5; }
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
  up=0; for i in $(seq 1 330); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$name up=$up"; }
stop() { kill $srv 2>/dev/null; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done; kill -9 $srv 2>/dev/null; sleep 2; }
LG() { n=$1; m=$2; shift 2; timeout 100 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $m --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
serve 1b $(cat $S/engine-args-1b.txt)
if [ $up = 1 ]; then
  M=Llama-3.2-1B-Instruct; W="--api completions --input-len 1024 --output-len 256"
  LG 1b-c1 $M $W --seed 501 --concurrency 1 --num-requests 16 --warmup-requests 2
  LG 1b-c32 $M $W --seed 502 --concurrency 32 --num-requests 400 --warmup-requests 32
  LG 1b-c128 $M $W --seed 503 --concurrency 128 --num-requests 512 --warmup-requests 64
fi
grep -E "Available KV|GPU KV cache size|Maximum concurrency|weights took|Model loading took|init engine|torch.compile takes" $R/serve-1b.log > $R/serve-1b-lines.txt
stop; pack
serve 70b-fp8 $(cat $S/engine-args-70b-fp8.txt)
if [ $up = 1 ]; then
  M=Llama-3.1-70B-Instruct; W="--api completions --input-len 2048 --output-len 512"
  LG 70b-fp8-c1 $M --api completions --input-len 1024 --output-len 256 --seed 511 --concurrency 1 --num-requests 4 --warmup-requests 1
  [ $(el) -lt 480 ] && LG 70b-fp8-c16 $M --api completions --input-len 1024 --output-len 256 --seed 512 --concurrency 16 --num-requests 48 --warmup-requests 0
  [ $(el) -lt 470 ] && LG 70b-fp8-c64 $M $W --seed 513 --concurrency 64 --num-requests 128 --warmup-requests 0
  curl -s http://127.0.0.1:8000/metrics | grep -E "^vllm:cache_config_info" > $R/cache-config-70b-fp8.txt
fi
pack; stop; T end; pack; ls -la $OUT
