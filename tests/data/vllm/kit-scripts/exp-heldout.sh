# run 9 (issue 13): held-out workloads for the simulator after the intake refit on runs 3-8: prompt and reply lengths
# and concurrencies none of the fits saw (8B: 512/128 c32, 256/256 c64, 2048/128 c16, 128/128 c128; 1B: 512/128 c32,
# 256/256 c64), closed loop with warm-up as the operator's Job runs it. Engines with the operator's flags
# (engine-args-realfit.txt, engine-args-1b.txt, as runs 3-8). Every load its own seed (901 on); results packed after each.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r9; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
pack() { tar czf $OUT/heldout-results.tgz -C /tmp r9; }
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
LG() { n=$1; m=$2; shift 2; [ $(el) -gt 520 ] && { T "skip $n"; return; }
  timeout 90 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $m --api completions --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done"; }
serve 8b $(cat $S/engine-args-realfit.txt)
if [ $up = 1 ]; then
  m=Llama-3.1-8B-Instruct
  LG 8b-r9-p512-c32 $m --input-len 512 --output-len 128 --seed 901 --concurrency 32 --num-requests 256 --warmup-requests 32
  LG 8b-r9-p256-c64 $m --input-len 256 --output-len 256 --seed 902 --concurrency 64 --num-requests 256 --warmup-requests 64
  LG 8b-r9-p2048-c16 $m --input-len 2048 --output-len 128 --seed 903 --concurrency 16 --num-requests 96 --warmup-requests 16
  LG 8b-r9-p128-c128 $m --input-len 128 --output-len 128 --seed 904 --concurrency 128 --num-requests 512 --warmup-requests 128
  pack
fi
stop
serve 1b $(cat $S/engine-args-1b.txt)
if [ $up = 1 ]; then
  m=Llama-3.2-1B-Instruct
  LG 1b-r9-p512-c32 $m --input-len 512 --output-len 128 --seed 905 --concurrency 32 --num-requests 256 --warmup-requests 32
  LG 1b-r9-p256-c64 $m --input-len 256 --output-len 256 --seed 906 --concurrency 64 --num-requests 256 --warmup-requests 64
fi
stop; T end; pack; ls -la $OUT
