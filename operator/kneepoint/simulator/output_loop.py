"""vLLM's API-server output path: when a token the engine made reaches its HTTP response.

vLLM 0.24's API server is one asyncio loop. Its output handler (``AsyncLLM.output_handler``) takes
each step's outputs from the EngineCore in order and runs ``OutputProcessor.process_outputs`` on
them in slices of ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` (128), yielding to the loop between two slices
of one step but not after a step's last slice: while outputs wait in its queue it goes straight on
to the next step's. Each processed output is put into its request's collector, which merges the
outputs that arrive before the request's own task runs; that task (the response's stream) runs only
when the handler yields, and writes one chunk with whatever its collector holds.

So the loop spends ``us_per_output`` on every output and ``us_per_write`` on every response it
wakes, and two regimes follow (run 24, ``tests/data/vllm/8b-h100-tp1-r24-stages.json.gz``):

- a step of more than 128 outputs yields after its first slice, so every response writes once a
  step, one token a chunk, however far behind the loop is: at 256 sequences of the 8B the loop
  handled about 12,800 outputs a second where the engine made 16,500, fell 0.6-0.75 s behind over
  a wave, and the engine sat idle that long between waves while the clients waited for their ends;
- a step of at most 128 outputs does not yield, so a loop that is behind processes the waiting
  steps back to back and each response then writes their tokens in one chunk (run 19's 1B at 128
  in flight: 172 chunks for 256 tokens): it cannot fall further behind than its per-output part.

Pure: the caller owns the clock. Calls come in time order: :meth:`OutputLoop.push` a step's
outputs when the step ends, :meth:`OutputLoop.written` the writes done by a time, and
:meth:`OutputLoop.next_event` when the next write happens if nothing more is pushed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)  # what names a response: the engine's request id

VLLM_OUTPUT_PROC_CHUNK_SIZE = 128
"""vLLM's ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` default (vllm/envs.py, 0.24): outputs processed between two yields."""


class OutputLoop(Generic[K]):
    """The API server's loop between the engine's outputs and the responses' writes."""

    def __init__(self, us_per_output: float, us_per_write: float, chunk: int = VLLM_OUTPUT_PROC_CHUNK_SIZE) -> None:
        if us_per_output < 0 or us_per_write < 0:
            raise ValueError("output-loop costs must not be negative")
        if chunk < 1:
            raise ValueError("the output chunk must hold at least one output")
        self.seconds_per_output = us_per_output * 1e-6
        self.seconds_per_write = us_per_write * 1e-6
        self.chunk = chunk
        self._busy_until = 0.0  # when the handler is done with what it was given
        self._pending: dict[K, int] = {}  # response -> tokens put into its collector, not written yet
        self._written: deque[tuple[float, K, int]] = deque()  # (written at, response, tokens), in time order

    @property
    def free(self) -> bool:
        """Whether the loop costs nothing (then a token is written when its step ends)."""
        return self.seconds_per_output <= 0 and self.seconds_per_write <= 0

    @property
    def busy_until(self) -> float:
        """When the handler is done with the outputs pushed so far (their writes may come after)."""
        return self._busy_until

    def push(self, at: float, keys: Sequence[K]) -> None:
        """A step's outputs (one per response in ``keys``, in the engine's order) reach the API server at ``at``."""
        if self._pending and self._busy_until <= at:
            self._flush(self._busy_until)  # the handler waited on an empty queue: the responses ran meanwhile
        start = max(at, self._busy_until)
        for first in range(0, len(keys), self.chunk):
            part = keys[first : first + self.chunk]
            start += len(part) * self.seconds_per_output
            for key in part:
                self._pending[key] = self._pending.get(key, 0) + 1
            if first + self.chunk < len(keys):  # a yield between two slices of one step
                start = self._flush(start)
        self._busy_until = start

    def next_event(self) -> float | None:
        """When the responses next write if nothing more is pushed (the handler then waits on its queue); None when nothing waits."""
        if self._written:
            return self._written[0][0]
        return self._busy_until + self.seconds_per_write if self._pending else None

    def written(self, until: float) -> list[tuple[float, K, int]]:
        """The writes done by ``until``: (time, response, tokens it carries), in time order."""
        if self._pending and self._busy_until <= until:
            self._flush(self._busy_until)  # nothing was pushed by then: the handler waits on its queue
        out = []
        while self._written and self._written[0][0] <= until:
            out.append(self._written.popleft())
        return out

    def _flush(self, at: float) -> float:
        """The waiting responses run, one write each, from ``at``; returns when the last is done."""
        for key, tokens in self._pending.items():
            at += self.seconds_per_write
            self._written.append((at, key, tokens))
        self._pending.clear()
        self._busy_until = max(self._busy_until, at)
        return at
