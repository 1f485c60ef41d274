"""Record one streamed request's raw SSE lines with their arrival times (perf_counter, s after the send)."""

import http.client, json, sys, time

path, body, out = sys.argv[1], sys.argv[2], sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", 8000, timeout=300)
t0 = time.perf_counter()
conn.request("POST", path, body=body, headers={"content-type": "application/json"})
resp = conn.getresponse()
rows = [{"t": 0.0, "status": resp.status, "request": json.loads(body), "path": path}]
while True:
    line = resp.fp.readline()
    if not line:
        break
    rows.append({"t": round(time.perf_counter() - t0, 6), "line": line.decode("utf-8", "replace").rstrip("\n")})
with open(out, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
