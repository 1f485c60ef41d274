# Run 17 (issue 13): is it the tokenizer? The 1B's closed loops of 1,024-token prompts keep their waves on real
# vLLM and get their first tokens late (runs 15-16); the API server tokenizes in one worker thread that waits for
# the interpreter lock while the main thread streams. Here the same closed loops are sent twice by one small client
# (ids_vs_text.py): with the load generator's text prompts, and with token-id prompts, which vLLM's completions
# route takes without tokenizing. Alternating arms (host drift), vLLM's histograms before and after each, the
# host sampler as in run 15. The 1B with the operator's flags (engine-args-1b.txt).
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
R=/tmp/r17; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
pack() { tar czf $OUT/ids-results.tgz -C /tmp r17; }
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
echo "api=$srv enginecore=$EC" > $R/pids.txt
python3 $S/host_sampler.py $R/samples.jsonl api=$srv enginecore=$EC & smp=$!
CL() { n=$1; shift; snap $n-before; T "start $n"; timeout 120 python3 $S/ids_vs_text.py $R/cl-$n.json "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done $(head -c 200 $R/cl-$n.txt)"; snap $n-after; }
snap() { curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(time_to_first_token|request_queue_time|request_prefill_time|e2e_request_latency|iteration_tokens)' > $R/m-$1.txt; }
CL warm text 1 2 0 1024 16 1700
CL c32-text-a text 32 160 32 1024 256 1701
CL c32-ids-a ids 32 160 32 1024 256 1702
CL c32-text-b text 32 160 32 1024 256 1703
CL c32-ids-b ids 32 160 32 1024 256 1704
pack
CL c8-text text 8 64 8 1024 256 1705
CL c8-ids ids 8 64 8 1024 256 1706
CL c128-text text 128 256 128 1024 256 1707
CL c128-ids ids 128 256 128 1024 256 1708
CL c32-128-text text 32 160 32 128 256 1709
CL c32-128-ids ids 32 160 32 128 256 1710
kill $smp 2>/dev/null
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
