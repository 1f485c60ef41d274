"""``--tokenizer PATH``: a Hugging Face ``tokenizer.json`` read from local files only.

PATH is a ``tokenizer.json`` file or a directory holding one (a model snapshot). Nothing is
downloaded. The ``tokenizers`` package is an optional extra
(``pip install 'kneepoint[tokenizer]'``); without it the flag fails with one line and the
synthetic-text generator remains available.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


class TokenizerFileError(ValueError):
    """The tokenizer cannot be loaded; the message is one line naming --tokenizer."""


class FileTokenizer:
    """Adapter from ``tokenizers.Tokenizer`` to ``workload.Tokenizer``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        special = set(tokenizer.get_added_tokens_decoder())
        candidates = [i for i in range(tokenizer.get_vocab_size(with_added_tokens=True)) if i not in special]
        # Keep tokens that survive decode -> encode alone: byte fragments of a UTF-8
        # character decode to U+FFFD and re-encode differently, which keeps the length
        # correction in workload.tokenizer_prompt from converging.
        texts = tokenizer.decode_batch([[i] for i in candidates], skip_special_tokens=True)
        encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
        self._sample_ids = [i for i, text, enc in zip(candidates, texts, encoded) if text and enc.ids == [i]]
        if not self._sample_ids:
            raise TokenizerFileError("--tokenizer: the vocabulary holds no ordinary tokens")

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (the server adds its own)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    def sample_ids(self) -> Sequence[int]:
        return self._sample_ids


def load_tokenizer(path: str) -> FileTokenizer:
    """Load ``path`` (tokenizer.json or a directory with one); TokenizerFileError on failure."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise TokenizerFileError(f"--tokenizer {path!r}: no such file (expected tokenizer.json or a directory holding one)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerFileError("--tokenizer needs the 'tokenizers' package: pip install 'kneepoint[tokenizer]'") from None
    try:
        tokenizer = Tokenizer.from_file(file)
    except Exception as error:  # noqa: BLE001 - the Rust side raises plain Exception subclasses
        raise TokenizerFileError(f"--tokenizer {file!r}: not a tokenizer.json ({' '.join(str(error).split())[:120]})") from None
    return FileTokenizer(tokenizer)
