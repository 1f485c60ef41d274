"""Build a local Hugging Face tokenizer for the benchmark against AIPerf and GuideLLM.

Both peers generate synthetic prompts with a tokenizer (AIPerf cuts token slices from the
Shakespeare corpus it ships; GuideLLM encodes Faker's lorem text and cuts it to length),
and this machine reaches no model hub. So a byte-level BPE is trained here with the
``tokenizers`` library on the peers' own prompt sources plus kneepoint's synthetic words:
AIPerf's ``shakespeare.txt``, 20,000 seeded Faker ``text()`` paragraphs, and the load
generator's word list. The vocabulary (64,000) is large enough that almost every word of
those sources, with its leading space, is one token. The engine simulator counts a text
prompt by the same kind of pieces (a word with its leading space, a punctuation run), so
the prompt lengths the peers ask for are close to what the simulator serves; the benchmark
reports the served lengths from the simulator's truth log anyway.

Run with the peers' interpreter (it needs aiperf's corpus and faker):

    ~/.cache/kneepoint/peers-venv/bin/python benchmarks/peer_tokenizer.py --out DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

VOCAB_SIZE = 64000


def corpus_lines(repo_root: str) -> list[str]:
    """The training text: AIPerf's corpus, Faker's lorem paragraphs, kneepoint's words."""
    spec = importlib.util.find_spec("aiperf")
    if spec is None or spec.origin is None:
        raise SystemExit("peer_tokenizer: aiperf is not importable; run with the peers' interpreter")
    shakespeare = os.path.join(os.path.dirname(spec.origin), "dataset", "generator", "assets", "shakespeare.txt")
    with open(shakespeare, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    from faker import Faker

    faker = Faker()
    Faker.seed(0)
    lines += [faker.text(max_nb_chars=400) for _ in range(20000)]
    sys.path.insert(0, os.path.join(repo_root, "operator"))
    from kneepoint.loadgen.workload import SYNTHETIC_WORDS

    lines += [" ".join(SYNTHETIC_WORDS)] * 50
    return lines


def build(out: str, repo_root: str) -> str:
    """Train the tokenizer and write tokenizer.json + tokenizer_config.json into ``out``."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tokenizer.train_from_iterator(corpus_lines(repo_root), trainer)
    os.makedirs(out, exist_ok=True)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "eos_token": "<|endoftext|>",
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write tokenizer.json and tokenizer_config.json")
    args = parser.parse_args()
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(build(args.out, repo_root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
