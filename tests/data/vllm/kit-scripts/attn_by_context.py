"""Run 42 (issue 13): vLLM 0.24's decode attention kernel (FlashAttention 3, the call its FlashAttention backend makes
for a decode step: paged KV of 16-token blocks, one query token a sequence, causal, AOT scheduler metadata) timed
alone by context, for the 8B's and the 14B's head shapes at 32 and 128 sequences. Runs 40-41's decode steps at 128
sequences rise with the context at about the HBM's datasheet rate and by about 0.3 ms a step each time the context
passes 256, 384 and 512 tokens; the model's KV read rises 1.25-1.3x faster. Each point: 10 calls captured in one CUDA
graph, replayed 20 times, timed with CUDA events (the median replay over 10); also one large copy's bandwidth.
Writes JSON lines to stdout. ``KP_CTX=start:stop:step`` (default 112:1297:16), ``KP_SPLITS=32,0``."""

import json
import os
import random
import statistics
import sys

import torch
from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

SHAPES = {"8b": (32, 8, 128), "14b": (40, 8, 128)}  # query heads, KV heads, head size (Llama-3.1-8B, Qwen2.5-14B)
BLOCK = 16
dev = torch.device("cuda")
print(json.dumps({"what": "device", "name": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)

# One large copy: what the HBM gives a streaming read and write.
n = 1 << 30  # 2 GiB of bf16
a = torch.empty(n, dtype=torch.bfloat16, device=dev)
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
times = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    b.copy_(a)
    e.record()
    e.synchronize()
    times.append(s.elapsed_time(e))
print(json.dumps({"what": "copy", "bytes_moved": 2 * 2 * n, "ms_p50": statistics.median(times), "gbps": 4 * n / statistics.median(times) / 1e6}), flush=True)
del a, b
torch.cuda.empty_cache()

lo, hi, step = (int(x) for x in os.environ.get("KP_CTX", "112:1297:16").split(":"))
contexts = list(range(lo, hi, step))
splits_list = [int(x) for x in os.environ.get("KP_SPLITS", "32,0").split(",")]
rng = random.Random(4200)
for shape, (hq, hkv, hd) in SHAPES.items():
    for batch in (32, 128):
        max_blocks = -(-max(contexts) // BLOCK) + 1
        num_blocks = batch * max_blocks + 16
        k_cache = torch.randn(num_blocks, BLOCK, hkv, hd, dtype=torch.bfloat16, device=dev)
        v_cache = torch.randn_like(k_cache)
        ids = list(range(num_blocks))
        rng.shuffle(ids)  # a pool's blocks in no order, as after a while of serving
        block_table = torch.tensor(ids[: batch * max_blocks], dtype=torch.int32, device=dev).view(batch, max_blocks)
        q = torch.randn(batch, hq, hd, dtype=torch.bfloat16, device=dev)
        out = torch.empty_like(q)
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=dev)
        for splits in splits_list:
            for ctx in contexts:
                try:
                    seqused = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
                    meta = get_scheduler_metadata(
                        batch_size=batch, max_seqlen_q=1, max_seqlen_k=ctx, num_heads_q=hq, num_heads_kv=hkv, headdim=hd,
                        cache_seqlens=seqused, qkv_dtype=torch.bfloat16, cu_seqlens_q=cu_q, page_size=BLOCK, causal=True,
                        window_size=(-1, -1), num_splits=splits,
                    )

                    def call() -> None:
                        flash_attn_varlen_func(
                            q=q, k=k_cache, v=v_cache, out=out, cu_seqlens_q=cu_q, max_seqlen_q=1, seqused_k=seqused,
                            max_seqlen_k=ctx, softmax_scale=hd**-0.5, causal=True, block_table=block_table,
                            scheduler_metadata=meta, fa_version=3, num_splits=splits,
                        )

                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for _ in range(10):
                            call()
                    graph.replay()
                    torch.cuda.synchronize()
                    reps = []
                    for _ in range(20):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        graph.replay()
                        e.record()
                        e.synchronize()
                        reps.append(s.elapsed_time(e) * 1e3 / 10)
                    kv_bytes = 2 * batch * ctx * hkv * hd * 2
                    us = statistics.median(reps)
                    print(json.dumps({"what": "attn", "shape": shape, "batch": batch, "ctx": ctx, "splits": splits, "us_p50": round(us, 3),
                                      "us_p10": round(sorted(reps)[2], 3), "kv_gbps": round(kv_bytes / us / 1e3, 1)}), flush=True)
                    del graph
                except Exception as exc:  # noqa: BLE001 - one point's failure is data, the sweep goes on
                    print(json.dumps({"what": "error", "shape": shape, "batch": batch, "ctx": ctx, "splits": splits, "error": repr(exc)[:300]}), flush=True)
        del k_cache, v_cache
        torch.cuda.empty_cache()
print(json.dumps({"what": "done"}), flush=True)
sys.exit(0)
