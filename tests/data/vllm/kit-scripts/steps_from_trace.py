"""Per-step table from a vLLM torch-profiler trace: one row per execute_* gpu_user_annotation."""

import gzip, json, re, sys

pat = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
path = sys.argv[1]
op = gzip.open if path.endswith(".gz") else open
with op(path, "rt") as f:
    doc = json.load(f)
rows = []
for e in doc.get("traceEvents", []):
    if e.get("ph") != "X" or e.get("cat") != "gpu_user_annotation":
        continue
    m = pat.fullmatch(e.get("name", ""))
    if m:
        rows.append((float(e["ts"]), float(e["dur"]), *map(int, m.groups())))
rows.sort()
print("start_us dur_us period_us ctx_seqs ctx_tokens gen_seqs gen_tokens")
for i, r in enumerate(rows):
    period = rows[i + 1][0] - r[0] if i + 1 < len(rows) else -1
    print(f"{r[0] - rows[0][0]:.1f} {r[1]:.1f} {period:.1f} {r[2]} {r[3]} {r[4]} {r[5]}")
