# Run 13 (issue 13): the 1B's "two host states". Runs 5, 6a, 6c and 9 saw the same 1B decode loop take about 1 ms a
# step longer in some loads than in others (TPOT 2.5-2.9 ms against 1.5-1.6 ms at c1), switching between loads of one
# engine. The 1B's step is vLLM's CPU time, so the question is where that CPU time runs. Here:
#   1. host_probe.py: per CPU, a Python loop, kernel enqueue, launch+sync round trip, a 200-kernel graph replay;
#   2. the 1B with the operator's flags (engine-args-1b.txt), unpinned as in runs 5-9: decode loads (128/512) and
#      1024/256 at c1, with host_sampler.py recording which CPU each vLLM thread runs on and how busy every CPU is;
#   3. the EngineCore's main thread (the busy loop) pinned to each of CPUs 0-11 in turn, its other threads on 13,
#      the API server on 14-15, the load generator on 12: one decode load each;
#   4. contention on purpose: the API server, then the load generator, on the busy loop's CPU;
#   5. the earlier slow loads again, same seeds (runs 5, 6a, 6c, 9), the busy loop alone on the fastest CPU;
#   6. everything unpinned again.
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
R=/tmp/r13; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1; grep MHz /proc/cpuinfo > $R/cpu-mhz-start.txt
pack() { tar czf $OUT/host-results.tgz -C /tmp r13; }
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
timeout 90 python3 $S/host_probe.py > $R/host-probe.jsonl 2> $R/host-probe.err; T "probe done"
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-1b.txt) --load-format dummy > $R/serve-1b.log 2>&1 & srv=$!
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
echo "api=$srv enginecore=$EC $(cat /proc/$EC/comm) $(tr '\0' ' ' < /proc/$EC/cmdline | cut -c1-80)" | tee $R/pids.txt
ps -eLo pid,tid,psr,comm --sort pid | awk -v a=$srv -v e=$EC '$1==a||$1==e' > $R/threads-at-start.txt
python3 $S/host_sampler.py $R/samples.jsonl api=$srv enginecore=$EC & smp=$!
M=Llama-3.2-1B-Instruct
LG() { n=$1; pin=$2; shift 2; T "start $n"; timeout 60 taskset -c $pin python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress --api completions "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done $(grep -o '"tpotMeanMs": [0-9.]*' $R/lg-$n.json | head -1)"; }
D="--input-len 128 --output-len 512"; W="--input-len 1024 --output-len 256"
ALL=0-15
# 2. unpinned, as in runs 5-9
LG u-d-c1a $ALL $D --seed 1301 --concurrency 1 --num-requests 4 --warmup-requests 1
LG u-d-c1b $ALL $D --seed 1302 --concurrency 1 --num-requests 4 --warmup-requests 1
LG u-c1-1024 $ALL $W --seed 1303 --concurrency 1 --num-requests 8 --warmup-requests 1
LG u-d-c16 $ALL $D --seed 1304 --concurrency 16 --num-requests 32 --warmup-requests 16
pack
# 3. the busy loop on each CPU
taskset -a -cp 14,15 $srv > /dev/null
for t in $(ls /proc/$EC/task); do [ $t = $EC ] || taskset -cp 13 $t > /dev/null; done
for c in 0 1 2 3 4 5 6 7 8 9 10 11; do
  taskset -cp $c $EC > /dev/null; LG e-cpu$c 12 $D --seed $((1320 + c)) --concurrency 1 --num-requests 4 --warmup-requests 1
done
pack
best=$(python3 - $R <<'PY'
import json, sys
r = sys.argv[1]; v = {}
for c in range(12):
    try: v[c] = json.load(open(f"{r}/lg-e-cpu{c}.json"))["summary"]["tpotMeanMs"]
    except Exception: pass
print(min(v, key=v.get) if v else 0)
PY
)
T "fastest busy-loop cpu $best"; taskset -cp $best $EC > /dev/null
LGSET=$(python3 -c "print(','.join(str(c) for c in range(13) if c != $best))")
# 4. contention on purpose
taskset -a -cp $best $srv > /dev/null; LG a-api-shared 12 $D --seed 1341 --concurrency 1 --num-requests 4 --warmup-requests 1
taskset -a -cp 14,15 $srv > /dev/null; LG a-loadgen-shared $best $D --seed 1342 --concurrency 1 --num-requests 4 --warmup-requests 1
LG a-alone $LGSET $D --seed 1343 --concurrency 1 --num-requests 4 --warmup-requests 1
pack
# 5. the earlier slow loads, same seeds, busy loop alone on the fastest CPU
LG r-c1 $LGSET $W --seed 501 --concurrency 1 --num-requests 16 --warmup-requests 2
LG r-c32 $LGSET $W --seed 502 --concurrency 32 --num-requests 400 --warmup-requests 32
LG r-c128 $LGSET $W --seed 503 --concurrency 128 --num-requests 512 --warmup-requests 64
LG r-c8 $LGSET $W --seed 606 --concurrency 8 --num-requests 160 --warmup-requests 8
LG r-c64 $LGSET $W --seed 607 --concurrency 64 --num-requests 400 --warmup-requests 64
LG r-p512-c32 $LGSET --input-len 512 --output-len 128 --seed 905 --concurrency 32 --num-requests 256 --warmup-requests 32
LG r-p256-c64 $LGSET --input-len 256 --output-len 256 --seed 906 --concurrency 64 --num-requests 256 --warmup-requests 64
LG r-d-c1-128 $LGSET $D --seed 632 --concurrency 1 --num-requests 6 --warmup-requests 1
pack
# 6. unpinned again
taskset -a -cp $ALL $srv > /dev/null; taskset -a -cp $ALL $EC > /dev/null
[ $(el) -lt 540 ] && LG v-d-c1a $ALL $D --seed 1351 --concurrency 1 --num-requests 4 --warmup-requests 1
[ $(el) -lt 545 ] && LG v-c1-1024 $ALL $W --seed 1352 --concurrency 1 --num-requests 8 --warmup-requests 1
[ $(el) -lt 550 ] && LG v-d-c1b $ALL $D --seed 1353 --concurrency 1 --num-requests 4 --warmup-requests 1
kill $smp 2>/dev/null
grep MHz /proc/cpuinfo > $R/cpu-mhz-end.txt
grep -E "Available KV|GPU KV cache size|Maximum concurrency|weights took|Model loading took|init engine|torch.compile takes" $R/serve-1b.log > $R/serve-1b-lines.txt
kill $srv 2>/dev/null; for i in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
