# Run 16 (issue 13): why the 1B's API server is slow to take requests while it streams (run 15: a burst of 8
# waited 24-27 ms before the engine on the idle server, 35-95 ms while 32 or 96 streams decoded, with the main
# thread 0.6-1.0 busy). gil_sampler/sitecustomize.py runs inside the API server process only: every 1 ms a
# thread wakes and records how late (its wait for the interpreter lock) and the main thread's innermost frames.
# Loads as in run 15 (the 1B with the operator's flags, engine-args-1b.txt; vLLM's histograms before and after
# each): c1 references, c32 1,024/256 and 128/256, c128 1,024/256, bursts of 8 x 1,024/16 idle and 2 s into 32
# or 96 decoding streams. The sampler's own cost is about 1 % of the thread: compare with run 15's same loads.
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
R=/tmp/r16; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
pack() { tar czf $OUT/gil-results.tgz -C /tmp r16; }
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
KP_GIL_SAMPLE=1 KP_GIL_OUT=$R/gil.jsonl PYTHONPATH=$S/gil_sampler:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-1b.txt) --load-format dummy > $R/serve-1b.log 2>&1 & srv=$!
up=0; for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "1b up=$up"; pack
[ $up = 1 ] || exit 0
EC=$(python3 - $srv <<'PY'
import os, sys
root = int(sys.argv[1]); kids = {}
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            f = open(f"/proc/{p}/stat").read(); r = f[f.rindex(")") + 2:].split()
            kids[int(p)] = (int(r[1]), int(r[11]) + int(r[12]))
        except OSError:
            pass
desc, todo = [], [root]
while todo:
    q = todo.pop(); c = [p for p, (pp, _) in kids.items() if pp == q]; desc += c; todo += c
def named(p):
    try:
        return "EngineCore" in open(f"/proc/{p}/cmdline").read() + open(f"/proc/{p}/comm").read()
    except OSError:
        return False
core = [p for p in desc if named(p)]
print(max(core or desc, key=lambda p: kids[p][1]))
PY
)
echo "api=$srv enginecore=$EC" > $R/pids.txt
python3 $S/host_sampler.py $R/samples.jsonl api=$srv enginecore=$EC & smp=$!
M=Llama-3.2-1B-Instruct
seed=1600
snap() { curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(time_to_first_token|request_queue_time|request_prefill_time|e2e_request_latency|request_inference_time|inter_token_latency|iteration_tokens)' > $R/m-$1.txt; }
LG() { n=$1; shift; seed=$((seed + 1)); snap $n-before; T "start $n"; timeout 90 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress --api completions --seed $seed "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done $(grep -o '"ttftP50Ms": [0-9.]*' $R/lg-$n.json | head -1)"; snap $n-after; }
ref() { LG ref-$1 --input-len 128 --output-len 512 --concurrency 1 --num-requests 3 --warmup-requests 1; }
W="--input-len 1024 --output-len 256"
LG warm --input-len 1024 --output-len 16 --concurrency 1 --num-requests 2 --warmup-requests 0
ref a
LG c32-1024 $W --concurrency 32 --num-requests 160 --warmup-requests 32
LG c32-128 --input-len 128 --output-len 256 --concurrency 32 --num-requests 160 --warmup-requests 32
LG c128-1024 $W --concurrency 128 --num-requests 384 --warmup-requests 128
pack
ref b
# Bursts of 8 x 1,024-token prompts (16-token replies): on the idle engine, then 2 s into a background load of B
# decode streams (128-token prompts, 2,048-token replies), twice each.
burst() { LG burst-$1 --input-len 1024 --output-len 16 --concurrency 8 --num-requests 8 --warmup-requests 0; }
bg() { b=$1; seed=$((seed + 1)); T "background b$b start"; timeout 60 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress --api completions --seed $seed --input-len 128 --output-len 2048 --concurrency $b --num-requests $b --warmup-requests 0 --save-json $R/bg-$2.json > $R/bg-$2.txt 2>&1 & bgp=$!; sleep 2; }
for k in a b; do
  burst idle-$k; sleep 0.5
  bg 32 b32-$k; burst b32-$k; wait $bgp; T "background done"
  bg 96 b96-$k; burst b96-$k; wait $bgp; T "background done"
done
ref c
kill $smp 2>/dev/null
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
