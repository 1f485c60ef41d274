"""Run 17 (issue 13): the same closed loop with text prompts and with token-id prompts, one client for both.
vLLM's /v1/completions takes a prompt as a list of token ids and then skips the API server's tokenizer, so the
difference between the two arms is the tokenizer's path (one worker thread that waits for the interpreter lock,
run 16). Text prompts are the load generator's own synthetic prompts (kneepoint.loadgen.workload), so with the
kit's word-level tokenizer both arms send the same number of tokens. Usage:
ids_vs_text.py OUT.json MODE(text|ids) CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED"""

import asyncio
import json
import random
import sys
import time

import aiohttp

from kneepoint.loadgen.workload import build_prompt

out, mode, conc, num, warm, inp, outl, seed = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
URL = "http://127.0.0.1:8000/v1/completions"
rng = random.Random(seed)


def prompt(i: int):
    if mode == "ids":
        return [rng.randrange(1000, 120000) for _ in range(inp)]
    p = build_prompt(seed, "measure" if i >= warm else "warmup", i, inp)
    return p.text if hasattr(p, "text") else p


async def one(session, i, records):
    body = {"model": "Llama-3.2-1B-Instruct", "prompt": prompt(i), "max_tokens": outl, "ignore_eos": True, "temperature": 0.0, "stream": True}
    start = time.perf_counter()
    first = None
    n = 0
    async with session.post(URL, json=body) as r:
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            d = json.loads(line[5:])
            if d.get("choices") and d["choices"][0].get("text"):
                n += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    records.append({"index": i, "start": start, "ttftMs": (first - start) * 1e3 if first else None, "latencyMs": (end - start) * 1e3, "chunks": n})


async def main():
    records = []
    nxt = 0
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
    ttft = sorted(r["ttftMs"] for r in kept if r["ttftMs"] is not None)
    summary = {"mode": mode, "concurrency": conc, "n": len(kept), "ttftP50Ms": ttft[len(ttft) // 2], "ttftMeanMs": sum(ttft) / len(ttft)}
    with open(out, "w") as f:
        json.dump({"summary": summary, "requests": kept}, f)
    print(json.dumps(summary))


asyncio.run(main())
