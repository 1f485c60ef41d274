"""The API server's output path (simulator.output_loop): per-output and per-write costs, the yield between two
slices of one step, and the merging of a response's tokens while the loop is behind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kneepoint.simulator.output_loop import VLLM_OUTPUT_PROC_CHUNK_SIZE, OutputLoop

US = 1e-6


def drain(loop: OutputLoop) -> list[tuple[float, object, int]]:
    out = []
    while (t := loop.next_event()) is not None:
        out += loop.written(t)
    return out


def test_an_idle_loop_processes_a_step_then_each_response_writes_one_after_another() -> None:
    loop = OutputLoop(us_per_output=10, us_per_write=50)
    loop.push(1.0, ["a", "b"])
    assert loop.written(1.0) == []
    writes = drain(loop)
    assert [(k, n) for _, k, n in writes] == [("a", 1), ("b", 1)]
    assert writes[0][0] == pytest.approx(1.0 + 20 * US + 50 * US)
    assert writes[1][0] == pytest.approx(1.0 + 20 * US + 100 * US)
    assert loop.next_event() is None


def test_a_step_larger_than_a_chunk_yields_after_its_first_slice() -> None:
    loop = OutputLoop(us_per_output=10, us_per_write=50, chunk=2)
    loop.push(0.0, ["a", "b", "c"])
    # slice [a, b], the yield (a and b write), then slice [c]; c writes when the handler waits on its queue
    writes = drain(loop)
    assert [k for _, k, _ in writes] == ["a", "b", "c"]
    assert [t / US for t, _, _ in writes] == pytest.approx([70, 120, 180])


def test_a_loop_behind_on_steps_of_at_most_a_chunk_merges_a_responses_tokens_into_one_write() -> None:
    loop = OutputLoop(us_per_output=1000, us_per_write=10)
    loop.push(0.0, ["a"])  # the handler is busy until 1 ms
    loop.push(0.0005, ["a"])  # waiting in its queue: processed straight after, no yield between
    writes = drain(loop)
    assert writes == [(pytest.approx(2000 * US + 10 * US), "a", 2)]


def test_a_loop_behind_on_steps_of_more_than_a_chunk_writes_every_token_and_falls_further_behind() -> None:
    """Run 24's regime: 256 outputs a step, more work than the step's time."""
    n, step = 256, 0.0155
    loop = OutputLoop(us_per_output=17.7, us_per_write=60)
    keys = list(range(n))
    for i in range(1, 101):
        loop.push(i * step, keys)
    writes = drain(loop)
    assert len(writes) == 100 * n and {w[2] for w in writes} == {1}  # one token a chunk
    behind = writes[-1][0] - 100 * step
    assert behind == pytest.approx(100 * (n * 77.7 * US - step) + step, rel=0.02)  # about 0.44 s behind after 100 steps


def test_a_write_waits_for_a_step_in_progress_but_not_for_one_that_comes_after_the_queue_emptied() -> None:
    loop = OutputLoop(us_per_output=100, us_per_write=100)
    loop.push(0.0, ["a"])  # processed by 0.1 ms, written at 0.2 ms
    assert loop.written(0.00015) == []
    loop.push(0.00015, ["b"])  # arrives while a's response writes: the handler takes it after that
    writes = drain(loop)
    assert [(round(t / US), k) for t, k, _ in writes] == [(200, "a"), (400, "b")]


def test_a_loop_that_costs_nothing_writes_when_the_step_ends() -> None:
    loop = OutputLoop(0, 0)
    assert loop.free
    loop.push(2.0, ["a", "b"])
    assert loop.written(2.0) == [(2.0, "a", 1), (2.0, "b", 1)]
    with pytest.raises(ValueError, match="negative"):
        OutputLoop(-1, 0)
    with pytest.raises(ValueError, match="at least one"):
        OutputLoop(1, 1, chunk=0)
    assert VLLM_OUTPUT_PROC_CHUNK_SIZE == 128


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0, 0.02), st.lists(st.integers(0, 9), min_size=1, max_size=12, unique=True)), min_size=1, max_size=30
    ),
    per_output=st.floats(0, 500),
    per_write=st.floats(0, 500),
    chunk=st.integers(1, 8),
)
def test_every_token_is_written_once_no_earlier_than_its_step_in_time_order(
    steps: list[tuple[float, list[int]]], per_output: float, per_write: float, chunk: int
) -> None:
    loop = OutputLoop(per_output, per_write, chunk)
    now, pushed, writes = 0.0, {}, []
    first_push: dict[int, list[float]] = {}
    for gap, keys in steps:
        now += gap
        writes += loop.written(now)
        loop.push(now, keys)
        for k in keys:
            pushed[k] = pushed.get(k, 0) + 1
            first_push.setdefault(k, []).append(now)
    writes += drain(loop)
    times = [t for t, _, _ in writes]
    assert times == sorted(times)
    got: dict[int, int] = {}
    for t, k, n in writes:
        assert n >= 1
        assert t >= first_push[k][got.get(k, 0)] - 1e-12  # a token is never written before its step ended
        got[k] = got.get(k, 0) + n
    assert got == pushed
