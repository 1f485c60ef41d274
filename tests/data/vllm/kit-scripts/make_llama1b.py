# The Llama-3.2-1B-shaped model folder, from the kit's 8B one (its tokenizer and generation config), as runs 5-17
# wrote it inline in each of their scripts; exp-stages.sh (runs 19-22) calls this instead of repeating it.
import json
import shutil

src, dst = "/tmp/k/models/llama-3-8b", "/tmp/k/models/llama-3.2-1b"
shutil.copytree(src, dst, dirs_exist_ok=True)
c = json.load(open(f"{src}/config.json"))
c.update(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64, num_hidden_layers=16, tie_word_embeddings=True)
c["rope_scaling"]["factor"] = 32.0
json.dump(c, open(f"{dst}/config.json", "w"), indent=1)
