# per-step CPU floor (issue 13: the simulator is twice too fast for a 1B model, whose GPU work per step is shorter than
# vLLM's CPU work per step). Decode-dominated loads (128-token prompts, 512-token replies) at c1..c128 on the 1B, so
# TPOT is the decode step's period at each batch size; two 1024/256 loads (c8, c64) the fit does not see, to check it;
# then the same decode-dominated loads on the 8B (its steps must stay GPU-bound: the floor may not touch it).
# Engines with the operator's flags (kube/manifests.py:vllm_args; engine-args-1b.txt, engine-args-realfit.txt, as run 5).
# The load generator: this checkout's operator/kneepoint. Every load its own seed; results packed after each step.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r6; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
pack() { tar czf $OUT/floor-results.tgz -C /tmp r6; }
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
  up=0; for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$name up=$up"; }
stop() { kill $srv 2>/dev/null; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done; kill -9 $srv 2>/dev/null; sleep 2; }
LG() { n=$1; m=$2; shift 2; timeout 60 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $m --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
D="--api completions --input-len 128 --output-len 512"
serve 1b $(cat $S/engine-args-1b.txt)
if [ $up = 1 ]; then
  M=Llama-3.2-1B-Instruct
  LG 1b-d-c1 $M $D --seed 601 --concurrency 1 --num-requests 6 --warmup-requests 1
  LG 1b-d-c4 $M $D --seed 602 --concurrency 4 --num-requests 24 --warmup-requests 4
  LG 1b-d-c16 $M $D --seed 603 --concurrency 16 --num-requests 64 --warmup-requests 16
  LG 1b-d-c64 $M $D --seed 604 --concurrency 64 --num-requests 192 --warmup-requests 64
  LG 1b-d-c128 $M $D --seed 605 --concurrency 128 --num-requests 256 --warmup-requests 128
  W="--api completions --input-len 1024 --output-len 256"
  LG 1b-c8 $M $W --seed 606 --concurrency 8 --num-requests 160 --warmup-requests 8
  LG 1b-c64 $M $W --seed 607 --concurrency 64 --num-requests 400 --warmup-requests 64
fi
grep -E "Available KV|GPU KV cache size|Maximum concurrency|weights took|Model loading took|init engine|torch.compile takes" $R/serve-1b.log > $R/serve-1b-lines.txt
stop; pack
if [ $(el) -lt 330 ]; then
  serve 8b $(cat $S/engine-args-realfit.txt)
  if [ $up = 1 ]; then
    M=Llama-3.1-8B-Instruct
    LG 8b-d-c1 $M $D --seed 611 --concurrency 1 --num-requests 4 --warmup-requests 1
    [ $(el) -lt 520 ] && LG 8b-d-c16 $M $D --seed 612 --concurrency 16 --num-requests 48 --warmup-requests 16
    [ $(el) -lt 530 ] && LG 8b-d-c64 $M $D --seed 613 --concurrency 64 --num-requests 128 --warmup-requests 64
    [ $(el) -lt 540 ] && LG 8b-d-c128 $M $D --seed 614 --concurrency 128 --num-requests 128 --warmup-requests 128
  fi
  stop
fi
T end; pack; ls -la $OUT
