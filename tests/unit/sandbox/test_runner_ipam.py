"""Loopback pod addresses: unique, round-robin, reserved after a runner restart."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kneepoint.sandbox.runner.ipam import LoopbackPool, PoolExhausted, parse_loopback_cidr


def test_allocation_is_stable_per_key_and_round_robin() -> None:
    pool = LoopbackPool("127.2.0.0/29")  # .1 - .6 usable
    assert [pool.allocate(k) for k in "abc"] == ["127.2.0.1", "127.2.0.2", "127.2.0.3"]
    assert pool.allocate("a") == "127.2.0.1"
    pool.release("a")
    # A freed address is reused only after the range went round.
    assert [pool.allocate(k) for k in "def"] == ["127.2.0.4", "127.2.0.5", "127.2.0.6"]
    assert pool.allocate("g") == "127.2.0.1"
    with pytest.raises(PoolExhausted):
        pool.allocate("h")


def test_reserve_keeps_adopted_addresses() -> None:
    pool = LoopbackPool("127.2.0.0/29")
    assert pool.reserve("old", "127.2.0.1")
    assert not pool.reserve("other", "127.2.0.1")
    assert not pool.reserve("x", "127.1.0.1")  # outside
    assert not pool.reserve("x", "127.2.0.7")  # broadcast
    assert pool.allocate("new") == "127.2.0.2"
    assert "127.2.0.3" in pool and "10.0.0.1" not in pool and "junk" not in pool


@pytest.mark.parametrize(
    ("cidr", "message"),
    [("10.0.0.0/16", "inside 127.0.0.0/8"), ("127.2.0.1/16", "CIDR form"), ("127.2.0.0/31", "at least 4"), ("nope", "CIDR form")],
)
def test_bad_cidrs_are_refused_with_one_line(cidr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_loopback_cidr(cidr)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 20)), max_size=200))
def test_no_address_is_held_twice(operations: list[tuple[bool, int]]) -> None:
    pool = LoopbackPool("127.2.0.0/27")
    held: dict[str, str] = {}
    for allocate, n in operations:
        key = f"k{n}"
        if allocate:
            held[key] = pool.allocate(key)
        else:
            pool.release(key)
            held.pop(key, None)
        assert len(set(held.values())) == len(held) == len(pool)


def test_skip_past_moves_round_robin_beyond_old_addresses() -> None:
    pool = LoopbackPool("127.2.0.0/29")
    pool.skip_past("127.2.0.3")
    pool.skip_past("127.2.0.2")  # behind the position: no effect
    pool.skip_past("10.0.0.1")
    assert pool.allocate("a") == "127.2.0.4"
    pool.skip_past("127.2.0.6")
    assert pool.allocate("b") == "127.2.0.1"
