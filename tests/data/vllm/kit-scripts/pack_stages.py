"""Runs 19-20 (issue 13): one run directory of exp-stages.sh (what came back under $OUT) as one archive for the
tests: every load's client capture, every stamp tagged with its process ("api": vLLM's API server, "core": its
EngineCore, told apart by the pids the serve log prints), vLLM's histogram lines before and after each load,
the timeline, the GPU, the host's CPUs and the serve log's start-up lines. Usage:
pack_stages.py RUN_DIR OUT.json.gz"""

import glob
import gzip
import json
import os
import re
import sys

run, out = sys.argv[1], sys.argv[2]
log = next(iter(glob.glob(f"{run}/serve-*.log")))
text = open(log).read()
role = {re.search(r"APIServer pid=(\d+)", text).group(1): "api", re.search(r"EngineCore pid=(\d+)", text).group(1): "core"}
stamps = []
for path in sorted(glob.glob(f"{run}/st/trace-*.jsonl")):
    who = role[os.path.basename(path)[6:-6]]
    stamps += [[who, *json.loads(line)] for line in open(path)]
stamps.sort(key=lambda r: r[2])
clients = {}
for path in sorted(glob.glob(f"{run}/cl-*.json")):
    clients[os.path.basename(path)[3:-5]] = json.load(open(path))
metrics = {os.path.basename(p)[2:-4]: open(p).read() for p in sorted(glob.glob(f"{run}/m-*.txt"))}
keep = ("Model loading took", "torch.compile took", "Graph capturing", "init engine", "Starting vLLM", "max_cudagraph_capture_size", "kp-stage")
doc = {
    "clients": clients,
    "stamps": stamps,
    "metrics": metrics,
    "timeline": open(f"{run}/timeline.txt").read(),
    "gpu": open(f"{run}/gpu.txt").read(),
    "lscpu": open(f"{run}/lscpu.txt").read(),
    "startup": [line[:300] for line in text.splitlines() if any(k in line for k in keep)],
}
with gzip.open(out, "wt") as f:
    json.dump(doc, f, separators=(",", ":"))
print(out, len(stamps), "stamps", len(clients), "loads")
