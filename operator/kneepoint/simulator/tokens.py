"""Token counting without a tokenizer, and the words the simulator "generates".

The simulator has no tokenizer (no model files, no network), so:
- a prompt given as token IDs (``[1, 2, 3]`` or ``[[1, 2, 3]]``, as the completions API
  allows) counts exactly;
- a text prompt counts the pieces of a Llama-3/GPT-4-style pre-tokenizer (a word with its
  leading space, a run of up to three digits, a run of punctuation, whitespace), with words
  longer than 10 characters counting one token per 10 characters. For text made of common
  English words this equals the real tokenizer's count; for rare words it undercounts.
- like vLLM with a Llama tokenizer, the completions API adds one BOS token to a text prompt,
  and the chat API adds the Llama-3.1-Instruct chat template: BOS, a system turn that always
  carries the template's date preamble ("Cutting Knowledge Date: December 2023 / Today Date:
  26 Jul 2024", 20 tokens) before any system message's content, 5 tokens per message around
  its content (header start, role, header end, blank line; end of turn) and 4 for the
  assistant header that asks for the reply: 35 tokens around one short user message, the
  overhead a chat load near max_model_len has to leave room for.
Generated text is a seeded sequence of common words, each one token with its leading space.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

_PIECE = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+(?!\S)|\s+", re.UNICODE)
_LONG_WORD = 10

BOS_TOKENS = 1
CHAT_TOKENS_PER_MESSAGE = 5
CHAT_REPLY_HEADER_TOKENS = 4
CHAT_SYSTEM_PREAMBLE_TOKENS = 20
"""Llama-3.1-Instruct's template opens the system turn with its knowledge and today dates."""
VOCAB_SIZE = 128256

WORDS = (
    " the",
    " of",
    " and",
    " to",
    " in",
    " is",
    " that",
    " for",
    " it",
    " as",
    " was",
    " with",
    " be",
    " by",
    " on",
    " not",
    " he",
    " this",
    " are",
    " or",
    " his",
    " from",
    " at",
    " which",
    " but",
    " have",
    " an",
    " had",
    " they",
    " you",
    " were",
    " their",
    " one",
    " all",
    " we",
    " can",
    " her",
    " has",
    " there",
    " been",
    " if",
    " more",
    " when",
    " will",
    " would",
    " who",
    " so",
    " no",
    " time",
    " new",
    " some",
    " these",
    " two",
    " may",
    " first",
    " then",
    " do",
    " any",
    " like",
    " my",
    " now",
    " over",
    " such",
    " our",
)
WORD_BYTES = tuple(w.encode() for w in WORDS)


def count_text_tokens(text: str) -> int:
    """Tokens of ``text`` by pre-tokenizer pieces (see the module docstring)."""
    total = 0
    for piece in _PIECE.findall(text):
        core = len(piece.strip()) or 1
        total += 1 if core <= _LONG_WORD else -(-core // _LONG_WORD)
    return total


class PromptError(ValueError):
    """A prompt the simulator cannot serve (the message names the field)."""


def count_completion_prompt(prompt: Any) -> int:
    """Prompt tokens of a ``/v1/completions`` ``prompt`` (one prompt: text or token IDs)."""
    if isinstance(prompt, str):
        return BOS_TOKENS + count_text_tokens(prompt)
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt)
        if len(prompt) == 1:
            return count_completion_prompt(prompt[0])
        if not prompt:
            raise PromptError("prompt: must not be empty")
        raise PromptError("prompt: the simulator serves one prompt per request (a string or a list of token IDs)")
    raise PromptError("prompt: must be a string or a list of token IDs")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts count
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise PromptError("messages[].content: must be a string or a list of content parts")


def count_chat_prompt(messages: Any, add_generation_prompt: bool = True) -> int:
    """Prompt tokens of a ``/v1/chat/completions`` ``messages`` list through the Llama-3.1 template."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages: must be a non-empty list")
    total = BOS_TOKENS + CHAT_SYSTEM_PREAMBLE_TOKENS + (CHAT_REPLY_HEADER_TOKENS if add_generation_prompt else 0)
    has_system = False
    for message in messages:
        if not isinstance(message, dict):
            raise PromptError("messages[]: each message must be an object with role and content")
        has_system = has_system or message.get("role") == "system"
        total += CHAT_TOKENS_PER_MESSAGE + count_text_tokens(_content_text(message.get("content")))
    if not has_system:  # the template writes its own system turn around the preamble
        total += CHAT_TOKENS_PER_MESSAGE
    return total


def token_ids(prompt: Any, count: int) -> list[int]:
    """IDs for ``/tokenize``: a token-ID prompt as given; otherwise ``count`` stable stand-in IDs
    (the simulator has no vocabulary: each is a hash of the prompt and position, below the
    Llama-3 vocabulary size), so the length is what the count says and repeats give the same IDs."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    seed = zlib.crc32(repr(prompt).encode())
    return [(seed * 2654435761 + i * 40503) % VOCAB_SIZE for i in range(count)]


def output_word(request_seed: int, index: int) -> bytes:
    """The ``index``-th generated token of a request, as UTF-8 bytes (JSON-safe, no escaping needed)."""
    return WORD_BYTES[(request_seed + index * 7) % len(WORD_BYTES)]


def output_text(request_seed: int, count: int) -> str:
    """The first ``count`` generated tokens of a request as one string."""
    return "".join(WORDS[(request_seed + i * 7) % len(WORDS)] for i in range(count))
