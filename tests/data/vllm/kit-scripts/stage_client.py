"""Run 19 (issue 13): a closed loop like the load-test Job's, whose requests carry an X-Request-Id that vLLM turns
into its own request id (``cmpl-<id>-0-<8 random>``), so each request's stamps inside vLLM
(stage_trace/sitecustomize.py) join the client's. Prompts are the load generator's own synthetic prompts
(kneepoint.loadgen.workload.build_prompt); times are time.time(), the clock the stamps use. Usage:
stage_client.py OUT.json LABEL STREAM(1|0) CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED"""

import asyncio
import json
import os
import sys
import time

import aiohttp

from kneepoint.loadgen.workload import build_prompt

out, label = sys.argv[1], sys.argv[2]
stream, conc, num, warm, inp, outl, seed = map(int, sys.argv[3:])
URL = "http://127.0.0.1:8000/v1/completions"


def prompt(i: int) -> str:
    p = build_prompt(seed, "measure" if i >= warm else "warmup", i, inp)
    return p.text if hasattr(p, "text") else p


async def one(session, i, records):
    rid = f"{label}-{i}"
    body = {"model": os.environ.get("KP_MODEL_NAME", "Llama-3.2-1B-Instruct"), "prompt": prompt(i), "max_tokens": outl, "ignore_eos": True, "temperature": 0.0, "stream": bool(stream)}
    start = time.time()
    first = None
    n = 0
    async with session.post(URL, json=body, headers={"X-Request-Id": rid}) as r:
        if stream:
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                d = json.loads(line[5:])
                if d.get("choices") and d["choices"][0].get("text"):
                    n += 1
                    if first is None:
                        first = time.time()
        else:
            await r.read()
    end = time.time()
    records.append({"id": rid, "index": i, "start": start, "first": first, "end": end, "chunks": n})


async def main():
    records = []
    total = warm + num
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        if warm:
            await asyncio.gather(*(one(s, i, records) for i in range(warm)))
        nxt = warm

        async def worker():
            nonlocal nxt
            while nxt < total:
                i = nxt
                nxt += 1
                await one(s, i, records)

        await asyncio.gather(*(worker() for _ in range(conc)))
    kept = sorted((r for r in records if r["index"] >= warm), key=lambda r: r["start"])
    ttft = sorted((r["first"] - r["start"]) * 1e3 for r in kept if r["first"] is not None)
    e2e = sorted((r["end"] - r["start"]) * 1e3 for r in kept)
    summary = {"label": label, "stream": stream, "concurrency": conc, "n": len(kept), "e2eP50Ms": e2e[len(e2e) // 2]}
    if ttft:
        summary["ttftP50Ms"] = ttft[len(ttft) // 2]
    with open(out, "w") as f:
        json.dump({"summary": summary, "requests": kept}, f)
    print(json.dumps(summary))


asyncio.run(main())
