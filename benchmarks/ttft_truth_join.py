"""Join a client's measured requests with the simulator's truth log; the TTFT error and served lengths.

``kneepoint sim --truth-log`` writes one JSON line per finished request with the TTFT the
simulator injected (``ttftSeconds``: from the request's arrival in the engine to the end of
the step that produced its first token) and the prompt tokens it served. A client's TTFT
also holds the HTTP request's way in, the response's way out and the client's own delay in
reading the chunk, so ``measured - injected`` is what the client adds on top of the server's
truth (plus the simulator's own HTTP handling, which is the same for every client).

The truth log also stamps the HTTP side (``received``: the handler started; ``firstWrite``:
the first token's bytes went to the connection), so a second error, against
``socketTtftSeconds``, leaves the simulator's HTTP path out: it is what the client itself
(and the loopback) adds.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from math import nan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "operator"))

from clients_under_test import ClientRun

from kneepoint.loadgen.statistics import percentile


@dataclass
class TruthJoin:
    """TTFT error statistics of one run (ms) and what the server saw of its requests."""

    joined: int
    unmatched: int
    abs_error_p50_ms: float
    abs_error_p99_ms: float
    signed_error_p50_ms: float
    injected_ttft_p50_ms: float
    served_prompt_tokens_p50: float
    server_output_tokens_per_s: float
    """Output tokens of the joined requests over the server's own window (first arrival to last finish)."""
    way_in_p50_ms: float
    """Client's start of the request to the simulator's arrival stamp (both wall clocks of one machine)."""
    way_out_p50_ms: float
    """The simulator's first-token stamp to the client's first-token time."""
    socket_abs_error_p50_ms: float
    """|measured - socketTtftSeconds|: against the TTFT at the server's socket (handler start to
    first write), so the simulator's HTTP path is not counted: what the client adds."""
    socket_abs_error_p99_ms: float
    socket_signed_error_p50_ms: float


def read_truth(path: str) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            rows[row["id"]] = row
    return rows


def join(run: ClientRun, truth: dict[str, dict]) -> TruthJoin | None:
    """Statistics over the client's successful requests that have a TTFT and a truth line."""
    abs_err, signed, injected, prompts, rows, way_in, way_out = [], [], [], [], [], [], []
    socket_abs, socket_signed = [], []
    unmatched = 0
    for request in run.requests:
        if not request.ok or request.ttft_ms is None:
            continue
        row = truth.get(request.join_id or "")
        if row is None:
            unmatched += 1
            continue
        truth_ms = row["ttftSeconds"] * 1000.0
        signed.append(request.ttft_ms - truth_ms)
        abs_err.append(abs(request.ttft_ms - truth_ms))
        injected.append(truth_ms)
        prompts.append(row["promptTokens"])
        rows.append(row)
        if request.wall_clock:
            way_in.append((row["arrival"] - request.start) * 1000.0)
            way_out.append((request.start + request.ttft_ms / 1000.0 - row["firstToken"]) * 1000.0)
        if row.get("socketTtftSeconds") is not None:
            socket_signed.append(request.ttft_ms - row["socketTtftSeconds"] * 1000.0)
            socket_abs.append(abs(socket_signed[-1]))
    if not rows:
        return None
    span = max(r["finish"] for r in rows) - min(r["arrival"] for r in rows)
    return TruthJoin(
        joined=len(rows),
        unmatched=unmatched,
        abs_error_p50_ms=percentile(abs_err, 50),
        abs_error_p99_ms=percentile(abs_err, 99),
        signed_error_p50_ms=percentile(signed, 50),
        injected_ttft_p50_ms=percentile(injected, 50),
        served_prompt_tokens_p50=percentile(prompts, 50),
        server_output_tokens_per_s=sum(r["outputTokens"] for r in rows) / span if span > 0 else float("nan"),
        way_in_p50_ms=percentile(way_in, 50) if way_in else nan,
        way_out_p50_ms=percentile(way_out, 50) if way_out else nan,
        socket_abs_error_p50_ms=percentile(socket_abs, 50) if socket_abs else nan,
        socket_abs_error_p99_ms=percentile(socket_abs, 99) if socket_abs else nan,
        socket_signed_error_p50_ms=percentile(socket_signed, 50) if socket_abs else nan,
    )
