"""The workload: seeded prompts of the asked length, request bodies, Poisson arrival times.

Every prompt is a function of (seed, phase, request index) alone, so any worker process
can build any request and a rerun with the same seed sends byte-identical prompts. Each
phase (warm-up, repeat 1, repeat 2, ...) gets different prompts: repeating the same
prompts would hit the server's prefix cache and make later repeats look faster.

Two generators:
- with a tokenizer (``--tokenizer``): random token ids from the tokenizer's vocabulary
  (special tokens excluded), decoded to text, re-encoded and corrected until the text
  encodes to exactly the asked number of tokens (the method of vLLM bench's random
  dataset);
- without one: seeded synthetic text of exactly N words drawn from short, frequent English
  words, which byte-level BPE vocabularies usually hold as one token each (with their
  leading space). That is an approximation: the server's usage block tells the real
  count, and the summary reports asked and served side by side.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# Frequent short English words (deduplicated, order kept so prompts never change).
SYNTHETIC_WORDS = tuple(
    dict.fromkeys(
        [
            "the",
            "of",
            "and",
            "to",
            "in",
            "is",
            "was",
            "for",
            "that",
            "on",
            "as",
            "with",
            "by",
            "he",
            "at",
            "from",
            "his",
            "it",
            "an",
            "were",
            "are",
            "which",
            "be",
            "this",
            "has",
            "also",
            "had",
            "not",
            "or",
            "first",
            "one",
            "their",
            "its",
            "after",
            "new",
            "who",
            "they",
            "two",
            "her",
            "she",
            "been",
            "other",
            "when",
            "time",
            "all",
            "during",
            "into",
            "year",
            "school",
            "would",
            "more",
            "most",
            "only",
            "over",
            "city",
            "some",
            "world",
            "would",
            "where",
            "later",
            "up",
            "such",
            "used",
            "many",
            "can",
            "state",
            "about",
            "national",
            "out",
            "known",
            "university",
            "united",
            "then",
            "made",
            "being",
            "part",
            "three",
            "while",
            "high",
            "team",
            "may",
            "years",
            "both",
            "century",
            "because",
            "four",
            "government",
            "since",
            "through",
            "war",
            "how",
            "these",
            "well",
            "under",
            "film",
            "south",
            "between",
            "season",
            "north",
            "five",
            "day",
            "main",
            "music",
            "early",
            "still",
            "game",
            "house",
            "did",
            "just",
            "like",
            "long",
            "people",
            "family",
            "well",
            "name",
            "used",
            "life",
            "take",
            "same",
            "way",
            "own",
            "local",
            "home",
            "west",
            "east",
            "back",
            "work",
            "good",
            "great",
            "last",
            "small",
            "large",
            "right",
            "left",
            "end",
            "point",
            "water",
            "power",
            "line",
            "place",
            "music",
            "book",
            "page",
            "data",
            "light",
            "road",
            "field",
            "group",
            "case",
            "world",
            "side",
            "head",
            "game",
            "word",
            "fact",
            "area",
            "week",
            "party",
            "money",
            "story",
            "land",
            "team",
            "body",
            "market",
            "house",
            "price",
            "level",
            "order",
            "class",
            "value",
            "model",
            "test",
            "plan",
            "form",
            "rate",
            "king",
            "food",
            "river",
        ]
    )
)

# How many decode/encode rounds the tokenizer generator tries before taking its best effort.
_MAX_ROUNDS = 20


class Tokenizer(Protocol):
    """What the prompt generator needs from a tokenizer (``tokenizer_files`` adapts one)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def sample_ids(self) -> Sequence[int]:
        """Token ids random prompts may use (no special or added tokens)."""
        ...


@dataclass(frozen=True)
class Prompt:
    """One request's prompt."""

    text: str
    tokens_asked: int
    tokens_local: int | None
    """Length by the local tokenizer (None without one): equal to tokens_asked unless the
    tokenizer cannot produce that exact length, which is then reported."""


def request_rng(seed: int, phase: str, index: int) -> random.Random:
    """The random stream of one request (string seeding is stable across Python versions)."""
    return random.Random(f"kneepoint-loadgen:{seed}:{phase}:{index}")


def synthetic_prompt(seed: int, phase: str, index: int, words: int) -> Prompt:
    """Seeded text of exactly ``words`` space-separated words (no tokenizer)."""
    rng = request_rng(seed, phase, index)
    text = " ".join(rng.choices(SYNTHETIC_WORDS, k=words))
    return Prompt(text=text, tokens_asked=words, tokens_local=None)


def tokenizer_prompt(tokenizer: Tokenizer, seed: int, phase: str, index: int, tokens: int) -> Prompt:
    """Seeded text that ``tokenizer`` encodes to exactly ``tokens`` tokens (best effort).

    Random ids rarely survive decode -> encode unchanged (merges across the joins), so the
    re-encoded ids are cut or topped up with new random ids and tried again.
    """
    rng = request_rng(seed, phase, index)
    pool = tokenizer.sample_ids()
    ids = [pool[rng.randrange(len(pool))] for _ in range(tokens)]
    text = tokenizer.decode(ids)
    length = len(tokenizer.encode(text))
    for _ in range(_MAX_ROUNDS):
        if length == tokens:
            break
        encoded = tokenizer.encode(text)
        if len(encoded) > tokens:
            ids = encoded[:tokens]
        else:
            ids = encoded + [pool[rng.randrange(len(pool))] for _ in range(tokens - len(encoded))]
        text = tokenizer.decode(ids)
        length = len(tokenizer.encode(text))
    return Prompt(text=text, tokens_asked=tokens, tokens_local=length)


def build_prompt(seed: int, phase: str, index: int, tokens: int, tokenizer: Tokenizer | None = None) -> Prompt:
    """The prompt of request ``index`` of ``phase``: tokenizer-exact when one is given."""
    if tokenizer is None:
        return synthetic_prompt(seed, phase, index, tokens)
    return tokenizer_prompt(tokenizer, seed, phase, index, tokens)


def build_request_body(api: str, model: str, prompt: str, output_tokens: int, stream: bool) -> dict[str, Any]:
    """JSON body that asks for exactly ``output_tokens`` tokens (max_tokens + ignore_eos).

    ``ignore_eos`` is vLLM's extension; a server that ignores it may stop early, which the
    client counts as ``short_output``. Chat uses ``max_completion_tokens`` (``max_tokens``
    is deprecated there). Temperature 0 as in vLLM bench.
    """
    body: dict[str, Any] = {"model": model, "temperature": 0.0, "ignore_eos": True, "stream": stream}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body["max_completion_tokens"] = output_tokens
    elif api == "completions":
        body["prompt"] = prompt
        body["max_tokens"] = output_tokens
    else:
        raise ValueError(f"api must be one of {sorted(API_PATHS)}, got {api!r}")
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def request_url(endpoint: str, api: str) -> str:
    """Full URL of ``api`` under the base URL ``endpoint`` (with or without a trailing /v1)."""
    base = endpoint.rstrip("/")
    path = API_PATHS[api]
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + path


def poisson_offsets(seed: int, phase: str, count: int, rate: float) -> list[float]:
    """Send times (seconds from the phase start) of ``count`` requests at mean ``rate``/s.

    Exponential gaps (a Poisson process, vLLM bench's burstiness 1); the first request
    goes at 0.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(f"kneepoint-loadgen:{seed}:{phase}:arrivals")
    offsets, now = [], 0.0
    for index in range(count):
        if index:
            now += rng.expovariate(rate)
        offsets.append(now)
    return offsets
