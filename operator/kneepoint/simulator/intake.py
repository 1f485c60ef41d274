"""vLLM's API-server intake: when a request sent to the server reaches the engine.

A request costs a fixed part (``us_per_request``) plus a part per prompt token
(``us_per_prompt_token``) between its arrival at the server and the engine. Three stages:

1. latency that overlaps between requests (the rest of the cost; HF tokenizers run in a thread
   pool and release the interpreter lock);
2. a **gate** (``gate_us_per_request``): work on the API server's one process that it shares
   between the requests it holds (processor sharing). Requests that come together leave it
   together, after about N times the work of one;
3. a **hand-over** (``serial_us_per_request`` + ``serial_us_per_prompt_token`` per token), one
   request after another.

Run 8's bursts of 128-token prompts (``tests/data/vllm/*-r8-bursts-and-ttft.json.gz``) show the
gate: the first of 128 requests sent at once got its first token 167-200 ms after the send on
the 8B, where a lone request's came after 21 ms, and the rest followed over the next 350 ms,
prefilled in ever larger steps as the hand-over let them through. Run 4's bursts of 1,024-token
prompts show the hand-over: the first is prefilled alone and the next seven together in the
step after. A lone request takes the whole cost either way (docs/simulator.md, "The intake").

Pure: the caller owns the clock and does the waiting. Calls come in time order; the intake says
when it next changes (:meth:`Intake.next_event`) and which requests reached the engine by a time
(:meth:`Intake.reached`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable

from kneepoint.simulator.calibration import ServingCalibration

_DONE = 1e-12  # seconds of work left that count as none


class Intake:
    """Overlapped latency, a shared gate, then a one-at-a-time hand-over to the engine."""

    def __init__(
        self,
        us_per_prompt_token: float,
        serial_us_per_prompt_token: float,
        us_per_request: float = 0.0,
        serial_us_per_request: float = 0.0,
        gate_us_per_request: float = 0.0,
    ) -> None:
        costs = (us_per_prompt_token, serial_us_per_prompt_token, us_per_request, serial_us_per_request, gate_us_per_request)
        if min(costs) < 0:
            raise ValueError("intake costs must not be negative")
        if serial_us_per_prompt_token > us_per_prompt_token or serial_us_per_request + gate_us_per_request > us_per_request:
            raise ValueError("the intake's serial and gate parts must fit in its whole cost")
        self.us_per_prompt_token = us_per_prompt_token
        self.serial_us_per_prompt_token = serial_us_per_prompt_token
        self.us_per_request = us_per_request
        self.serial_us_per_request = serial_us_per_request
        self.gate_us_per_request = gate_us_per_request
        self._clock = 0.0
        self._seq = itertools.count()
        self._delayed: list[tuple[float, int, Hashable, float]] = []  # (reaches the gate, seq, key, hand-over work)
        self._gate: dict[Hashable, tuple[float, float]] = {}  # key -> (gate work left, hand-over work), in entry order
        self._handover_free = 0.0
        self._leaving: list[tuple[float, int, Hashable]] = []  # (reaches the engine, seq, key)

    @classmethod
    def of(cls, serving: ServingCalibration) -> Intake:
        """The intake a calibration describes."""
        return cls(
            serving.api_us_per_prompt_token,
            serving.api_serial_us_per_prompt_token,
            serving.api_us_per_request,
            serving.api_serial_us_per_request,
            serving.api_gate_us_per_request,
        )

    @property
    def free(self) -> bool:
        """Whether the intake costs nothing (then a request reaches the engine when it is sent)."""
        return self.us_per_prompt_token <= 0 and self.us_per_request <= 0

    def lone_seconds(self, prompt_tokens: int) -> float:
        """What one request with nothing else in the intake takes."""
        return (self.us_per_request + self.us_per_prompt_token * prompt_tokens) * 1e-6

    def receive(self, at: float, key: Hashable, prompt_tokens: int) -> None:
        """A request the server received at ``at``. Its overlapped part runs from ``at``; the gate and
        the hand-over no earlier than the intake's clock (the last time it was advanced to)."""
        handover = (self.serial_us_per_request + self.serial_us_per_prompt_token * prompt_tokens) * 1e-6
        ahead = self.lone_seconds(prompt_tokens) - handover - self.gate_us_per_request * 1e-6
        heapq.heappush(self._delayed, (at + ahead, next(self._seq), key, handover))

    def next_event(self) -> float | None:
        """When the intake next changes if nothing more is received; None when it holds nothing."""
        times = []
        if self._delayed:
            times.append(self._delayed[0][0])
        if self._leaving:
            times.append(self._leaving[0][0])
        if self._gate:
            times.append(self._clock + min(w for w, _ in self._gate.values()) * len(self._gate))
        return min(times) if times else None

    def reached(self, until: float) -> list[tuple[float, Hashable]]:
        """Advance to ``until``: the requests that reached the engine by then, (time, key) in order."""
        self._advance_gate(until)
        out = []
        while self._leaving and self._leaving[0][0] <= until:
            at, _, key = heapq.heappop(self._leaving)
            out.append((at, key))
        return out

    def _advance_gate(self, until: float) -> None:
        while True:
            held = len(self._gate)
            least = min(w for w, _ in self._gate.values()) if held else 0.0
            done_at = self._clock + least * held if held else float("inf")
            enter_at = self._delayed[0][0] if self._delayed else float("inf")
            if min(done_at, enter_at) > until:
                if held:
                    self._take((until - self._clock) / held)
                self._clock = max(self._clock, until)
                return
            if done_at <= enter_at:
                # Take exactly the least work from each, so the one that finishes is at zero
                # whatever the clock's magnitude.
                self._take(least)
                self._clock = max(self._clock, done_at)
                for key in [k for k, (left, _) in self._gate.items() if left <= _DONE]:
                    _, handover = self._gate.pop(key)
                    self._handover_free = max(self._handover_free, self._clock) + handover
                    heapq.heappush(self._leaving, (self._handover_free, next(self._seq), key))
            else:
                if held:
                    self._take((enter_at - self._clock) / held)
                self._clock = max(self._clock, enter_at)
                while self._delayed and self._delayed[0][0] <= self._clock:
                    _, _, key, handover = heapq.heappop(self._delayed)
                    self._gate[key] = (self.gate_us_per_request * 1e-6, handover)

    def _take(self, each: float) -> None:
        for key, (left, handover) in self._gate.items():
            self._gate[key] = (left - each, handover)
