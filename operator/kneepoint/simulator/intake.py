"""vLLM's API-server intake: when a request sent to the server reaches the engine.

A request costs ``us_per_prompt_token`` per prompt token between its arrival at the server and
the engine (8.2 ms for 1,024 tokens: the unprofiled TTFT at concurrency 1 minus the modelled
prefill). Only ``serial_us_per_prompt_token`` of that is taken one request after another (the
hand-over on the API server's event loop), after the rest, which overlaps between requests
(vLLM 0.24 tokenizes in a thread pool, ``renderers/base.py``). With the whole cost serial (the
model before) a burst of eight 1,024-token prompts reached the engine 8.2 ms apart; in run 3's
per-request records real vLLM prefills the first of a burst alone and the next seven together
in the step after, so they reached it within that first prefill (docs/simulator.md, "The
intake").

Pure: the caller owns the clock and does the waiting.
"""

from __future__ import annotations


class Intake:
    """An overlapped stage then a serial one; a lone request takes the whole cost either way."""

    def __init__(self, us_per_prompt_token: float, serial_us_per_prompt_token: float) -> None:
        if us_per_prompt_token < 0 or serial_us_per_prompt_token < 0:
            raise ValueError("intake costs must not be negative")
        self.us_per_prompt_token = us_per_prompt_token
        self.serial_us_per_prompt_token = min(serial_us_per_prompt_token, us_per_prompt_token)
        self._serial_free_at = 0.0

    def arrival(self, received_at: float, prompt_tokens: int) -> float:
        """The time a request received at ``received_at`` reaches the engine (calls in receipt order)."""
        serial = self.serial_us_per_prompt_token * prompt_tokens * 1e-6
        overlapped = (self.us_per_prompt_token - self.serial_us_per_prompt_token) * prompt_tokens * 1e-6
        self._serial_free_at = max(self._serial_free_at, received_at + overlapped) + serial
        return self._serial_free_at
