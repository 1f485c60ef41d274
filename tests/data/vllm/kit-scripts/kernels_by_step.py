"""Per-step kernel time from a vLLM torch-profiler trace (run 14): for each step (the execute_* annotations), the
GPU span, the period to the next step, the sum and count of the kernels inside the GPU span, and the CPU side's span
of the same annotation. A step whose kernel sum is well under its period waits for the host."""

import gzip
import json
import re
import sys

pat = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
path = sys.argv[1]
with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
    events = json.load(f).get("traceEvents", [])
gpu, cpu, kernels = [], {}, []
for e in events:
    if e.get("ph") != "X":
        continue
    cat, name = e.get("cat"), e.get("name", "")
    if cat == "gpu_user_annotation" and pat.fullmatch(name):
        gpu.append((float(e["ts"]), float(e["dur"]), name))
    elif cat == "user_annotation" and pat.fullmatch(name):
        cpu.setdefault(name, []).append(float(e["dur"]))
    elif cat == "kernel":
        kernels.append((float(e["ts"]), float(e["dur"])))
gpu.sort()
kernels.sort()
print("start_us gpu_span_us period_us kernel_sum_us kernels cpu_span_us ctx_seqs ctx_tokens gen_seqs gen_tokens")
j = 0
seen: dict[str, int] = {}
for i, (ts, dur, name) in enumerate(gpu):
    while j < len(kernels) and kernels[j][0] < ts:
        j += 1
    k, total, n = j, 0.0, 0
    while k < len(kernels) and kernels[k][0] < ts + dur:
        total += kernels[k][1]
        n += 1
        k += 1
    period = gpu[i + 1][0] - ts if i + 1 < len(gpu) else -1
    idx = seen.get(name, 0)
    seen[name] = idx + 1
    spans = cpu.get(name, [])
    cpu_span = spans[idx] if idx < len(spans) else -1
    groups = " ".join(pat.fullmatch(name).groups())
    print(f"{ts - gpu[0][0]:.1f} {dur:.1f} {period:.1f} {total:.1f} {n} {cpu_span:.1f} {groups}")
