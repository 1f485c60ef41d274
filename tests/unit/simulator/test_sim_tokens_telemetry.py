"""Token counting without a tokenizer, and the sliding-window telemetry behind the DCGM and comm-fraction gauges."""

from __future__ import annotations

import pytest

from kneepoint.simulator.telemetry import Telemetry
from kneepoint.simulator.tokens import (
    WORDS,
    PromptError,
    count_chat_prompt,
    count_completion_prompt,
    count_text_tokens,
    output_text,
    output_word,
    token_ids,
)


def test_text_counts_pre_tokenizer_pieces() -> None:
    assert count_text_tokens("Hello, world! This is a test of 12345 tokens.") == 13
    assert count_text_tokens(" the of and") == 3
    assert count_text_tokens("internationalization") == 2  # 20 letters: one token per 10 characters
    assert all(count_text_tokens(w) == 1 for w in WORDS)


def test_completion_and_chat_prompts() -> None:
    assert count_completion_prompt("a b c") == 4  # BOS + 3
    assert count_completion_prompt([5, 6, 7]) == 3
    assert count_completion_prompt([[5, 6, 7]]) == 3
    # Llama-3.1-Instruct: BOS, the system turn with its 20-token date preamble, 5 per message, 4 for the reply header.
    assert count_chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]) == 1 + 20 + 4 + (5 + 2) + (
        5 + 1
    )
    assert count_chat_prompt([{"role": "user", "content": [{"type": "text", "text": "two words"}]}]) == 1 + 20 + 5 + 4 + 5 + 2
    # About 35 tokens around one short user message, as the issue measured for Llama-3.1-Instruct.
    assert count_chat_prompt([{"role": "user", "content": "hi"}]) - 1 == 35
    assert count_chat_prompt([{"role": "user", "content": "hi"}], add_generation_prompt=False) == 36 - 4
    for bad in (None, 3, [], ["a", "b"]):
        with pytest.raises(PromptError):
            count_completion_prompt(bad)
    with pytest.raises(PromptError):
        count_chat_prompt([])


def test_token_ids_for_tokenize() -> None:
    assert token_ids([5, 6, 7], 3) == [5, 6, 7]
    ids = token_ids("a b c", 4)
    assert len(ids) == 4 and ids == token_ids("a b c", 4) and all(0 <= i < 128256 for i in ids)
    assert token_ids("a b d", 4) != ids


def test_output_words_are_seeded_and_one_token_each() -> None:
    text = output_text(7, 20)
    assert count_text_tokens(text) == 20
    assert text == "".join(output_word(7, i).decode() for i in range(20))
    assert output_text(8, 20) != text


def test_window_rates_and_a_comm_fraction_that_holds_when_idle() -> None:
    t = Telemetry(window_seconds=1.0, comm_window_seconds=10.0)
    for i in range(100):  # 100 steps of 5 ms, 1 ms of it collectives, in the second ending at 10.0
        t.record(end=9.0 + (i + 1) * 0.01, duration=0.005, comm_seconds=0.001, link_bytes=1e6, tokens=32, sampled=32)
    r = t.rates(10.0)
    assert r.busy_fraction == pytest.approx(0.5)
    assert r.link_tx_bytes_per_s == pytest.approx(1e8)
    assert r.h2d_bytes_per_s == pytest.approx(100 * 32 * 16)
    assert t.comm_fraction(10.0) == pytest.approx(0.2)
    assert t.link_bytes_total == pytest.approx(2e8)
    # Idle for a minute: utilisation falls to 0, the comm share keeps its last value.
    assert t.rates(70.0).busy_fraction == 0.0
    assert t.comm_fraction(70.0) == pytest.approx(0.2)
