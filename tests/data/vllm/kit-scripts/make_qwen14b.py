# The Qwen2.5-14B-shaped model folder and its tokenizer folder (runs 18 and 18b).
import json, os, shutil
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken
src, dst = "/tmp/k/models/llama-3-8b", "/tmp/k/models/qwen2.5-14b"
os.makedirs(dst, exist_ok=True)
for f in ("generation_config.json", "tokenizer_config.json"):
    shutil.copy(f"{src}/{f}", dst)
tok = Tokenizer.from_file(f"{src}/tokenizer.json")
vocab = dict(tok.get_vocab(with_added_tokens=True))
specials = {k: v for k, v in vocab.items() if k.startswith("<")}
VOCAB = 152064  # Qwen2.5's: every id the random weights may sample decodes
i = 0
while len(vocab) < VOCAB:
    vocab.setdefault(f"q{i}", len(vocab)); i += 1
new = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
new.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
new.decoder = decoders.WordPiece(prefix="##", cleanup=False)
new.add_special_tokens([AddedToken(s, special=True) for s in specials])
new.post_processor = tok.post_processor
new.save(f"{dst}/tokenizer.json")
base = json.load(open(f"{src}/config.json"))
cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 13824,
       "num_attention_heads": 40, "num_key_value_heads": 8, "num_hidden_layers": 48, "vocab_size": VOCAB,
       "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "hidden_act": "silu",
       "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
       "sliding_window": 131072, "max_window_layers": 48, "attention_dropout": 0.0, "initializer_range": 0.02,
       "bos_token_id": base["bos_token_id"], "eos_token_id": base["eos_token_id"]}
json.dump(cfg, open(f"{dst}/config.json", "w"), indent=1)
print("qwen2.5-14b model folder:", len(vocab), "tokens")
# The tokenizer apart, in a Llama-typed folder: transformers 5 rebuilds a qwen2-typed folder's tokenizer as Qwen2's
# byte-level BPE (first try of this run: every prompt tokenized to nothing). Only the dummy kit needs this.
tok_dir = "/tmp/k/models/tok-qwen-152k"
shutil.copytree(src, tok_dir, dirs_exist_ok=True)
shutil.copy(f"{dst}/tokenizer.json", tok_dir)
json.dump(dict(base, vocab_size=VOCAB), open(f"{tok_dir}/config.json", "w"), indent=1)
