"""Prompts, request bodies, arrival times, --resolve parsing and the worker plan (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kneepoint.loadgen.resolve_rules import ResolveRuleError, parse_resolve_rule, parse_resolve_rules
from kneepoint.loadgen.worker_plan import (
    CONCURRENCY_PER_WORKER,
    escalate_workers,
    parse_cgroup_cpu_max,
    parse_workers,
    plan_workers,
    split_concurrency,
    usable_cores,
)
from kneepoint.loadgen.workload import (
    SYNTHETIC_WORDS,
    build_prompt,
    build_request_body,
    poisson_offsets,
    request_url,
)


@given(st.integers(min_value=1, max_value=3000), st.integers(min_value=0, max_value=2**31), st.integers(0, 10_000))
@settings(max_examples=40)
def test_synthetic_prompt_has_exactly_the_asked_words(tokens: int, seed: int, index: int) -> None:
    prompt = build_prompt(seed, "repeat-1", index, tokens)
    assert len(prompt.text.split(" ")) == tokens
    assert all(word in SYNTHETIC_WORDS for word in prompt.text.split(" "))
    assert prompt.tokens_asked == tokens and prompt.tokens_local is None


def test_prompts_are_seeded_and_differ_by_phase_and_index() -> None:
    a = build_prompt(7, "repeat-1", 3, 64).text
    assert a == build_prompt(7, "repeat-1", 3, 64).text
    assert a != build_prompt(8, "repeat-1", 3, 64).text
    assert a != build_prompt(7, "repeat-2", 3, 64).text
    assert a != build_prompt(7, "repeat-1", 4, 64).text
    # a fixed seed gives a fixed prompt across runs and Python versions (string seeding)
    assert build_prompt(0, "repeat-1", 0, 5).text == build_prompt(0, "repeat-1", 0, 5).text


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """A byte-level BPE tokenizer trained here on a few sentences and saved as tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    from kneepoint.loadgen.tokenizer_files import load_tokenizer

    model = tokenizers.Tokenizer(tokenizers.models.BPE())
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["the quick brown fox jumps over the lazy dog", "load tests measure tokens per second and latency"] * 50
    model.train_from_iterator(corpus, trainer)
    directory = tmp_path_factory.mktemp("tok")
    model.save(str(directory / "tokenizer.json"))
    return load_tokenizer(str(directory))


@pytest.mark.parametrize("tokens", [1, 7, 128, 1000])
def test_tokenizer_prompt_encodes_to_exact_length(tiny_tokenizer, tokens: int) -> None:
    for index in range(5):
        prompt = build_prompt(3, "repeat-1", index, tokens, tiny_tokenizer)
        assert prompt.tokens_local == tokens
        assert len(tiny_tokenizer.encode(prompt.text)) == tokens
    assert build_prompt(3, "repeat-1", 0, tokens, tiny_tokenizer) == build_prompt(3, "repeat-1", 0, tokens, tiny_tokenizer)


def test_tokenizer_never_samples_special_tokens(tiny_tokenizer) -> None:
    assert 0 not in tiny_tokenizer.sample_ids() and 1 not in tiny_tokenizer.sample_ids()


def test_tokenizer_file_errors(tmp_path) -> None:
    from kneepoint.loadgen.tokenizer_files import TokenizerFileError, load_tokenizer

    with pytest.raises(TokenizerFileError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "missing"))
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    pytest.importorskip("tokenizers")
    with pytest.raises(TokenizerFileError, match=r"not a tokenizer\.json"):
        load_tokenizer(str(tmp_path))


def test_request_bodies() -> None:
    completions = build_request_body("completions", "m", "hi", 16, stream=True)
    assert completions == {
        "model": "m",
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "prompt": "hi",
        "max_tokens": 16,
        "stream_options": {"include_usage": True},
    }
    chat = build_request_body("chat", "m", "hi", 16, stream=False)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["max_completion_tokens"] == 16 and "max_tokens" not in chat
    assert "stream_options" not in chat  # vLLM answers 400 to stream_options without stream
    with pytest.raises(ValueError):
        build_request_body("embeddings", "m", "hi", 1, stream=True)


def test_request_url() -> None:
    assert request_url("http://h:8000", "completions") == "http://h:8000/v1/completions"
    assert request_url("http://h:8000/v1/", "chat") == "http://h:8000/v1/chat/completions"
    assert request_url("http://h/prefix", "chat") == "http://h/prefix/v1/chat/completions"


def test_poisson_offsets() -> None:
    offsets = poisson_offsets(1, "repeat-1", 4000, rate=50.0)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets == poisson_offsets(1, "repeat-1", 4000, rate=50.0)
    mean_rate = (len(offsets) - 1) / offsets[-1]
    assert 45.0 < mean_rate < 55.0  # 4000 exponential gaps: within 10 % of 50/s
    with pytest.raises(ValueError):
        poisson_offsets(1, "x", 3, 0.0)


def test_resolve_rules() -> None:
    assert parse_resolve_rule("Engine.ns.svc:8000:127.0.0.5") == (("engine.ns.svc", 8000), "127.0.0.5")
    assert parse_resolve_rule("h:80:[::1]") == (("h", 80), "::1")
    assert parse_resolve_rule("h:80:::1") == (("h", 80), "::1")
    rules = parse_resolve_rules(["a:1:127.0.0.9"], "a:1:127.0.0.2, b:2:127.0.0.3")
    assert rules == {("a", 1): "127.0.0.9", ("b", 2): "127.0.0.3"}
    for bad in ("nohost", "h:port:127.0.0.1", "h:0:127.0.0.1", "h:80:not-an-ip", "h:80:"):
        with pytest.raises(ResolveRuleError, match="--resolve"):
            parse_resolve_rule(bad)


def test_worker_plan() -> None:
    assert parse_workers("auto") is None and parse_workers("3") == 3
    for bad in ("0", "x", "65"):
        with pytest.raises(ValueError, match="--workers"):
            parse_workers(bad)
    assert plan_workers(None, 8, cores=16) == 1
    assert plan_workers(None, CONCURRENCY_PER_WORKER + 1, cores=16) == 2
    assert plan_workers(None, 100 * CONCURRENCY_PER_WORKER, cores=4) == 4
    assert plan_workers(4, 2, cores=16) == 2  # never more workers than streams
    assert split_concurrency(10, 3) == [4, 3, 3]
    assert parse_cgroup_cpu_max("max 100000\n") is None
    assert parse_cgroup_cpu_max("250000 100000") == 2.5
    assert usable_cores(16, 2.5) == 2 and usable_cores(16, 0.5) == 1 and usable_cores(3, None) == 3


def test_escalate_workers() -> None:
    assert escalate_workers(1, cores=8, concurrency=64, cpu_saturated=True) == 2
    assert escalate_workers(4, cores=6, concurrency=64, cpu_saturated=True) == 6
    assert escalate_workers(2, cores=2, concurrency=64, cpu_saturated=True) is None  # no core left
    assert escalate_workers(2, cores=8, concurrency=2, cpu_saturated=True) is None  # no stream left
    assert escalate_workers(1, cores=8, concurrency=64, cpu_saturated=False) is None
