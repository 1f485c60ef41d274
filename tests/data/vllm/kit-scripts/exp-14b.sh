# Run 18 (issues 13 and 18): a held-out architecture and size. Qwen2.5-14B's shape (Qwen2: 48 layers, hidden 5,120,
# 40 heads / 8 KV heads, biased QKV, a 152,064-token vocabulary) in bf16 on one H200, with the operator's own flags
# (engine-args-14b.txt: the manifest builder's for the example experiment with model Qwen/Qwen2.5-14B-Instruct),
# none of it fitted: the simulator's decode, prefill and intake were fitted to Llama shapes (8B, 1B, 70B fp8).
# Closed loops as the operator's Job runs them (warm-up, then the measured phase), every load its own seed (1801 on).
# The start-up is timed twice: cold, then restarted with the same VLLM_CACHE_ROOT (torch.compile cached), as a tier
# started again with the compile cache on the model-cache volume (issue 18's cost model has only the 8B's).
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r18; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH VLLM_CACHE_ROOT=/tmp/vcache
echo "loadgen: checkout $(git rev-parse HEAD 2>/dev/null) operator/kneepoint" > $R/loadgen-source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
pack() { tar czf $OUT/r18-results.tgz -C /tmp r18; }
python3 - <<'PY'
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
PY
M=Qwen2.5-14B-Instruct
serve() { name=$1; T "serve $name start"; python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-14b.txt) --load-format dummy --tokenizer /tmp/k/models/tok-qwen-152k > $R/serve-$name.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$name up=$up"; curl -s http://127.0.0.1:8000/metrics > $R/metrics-$name.txt; pack; }
stop() { kill $srv 2>/dev/null; for i in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done; kill -9 $srv 2>/dev/null; sleep 2; T "stopped"; }
seed=1800
LG() { n=$1; shift; seed=$((seed + 1)); [ $(el) -gt 535 ] && { T "skip $n"; return; }
  T "start $n"; timeout 80 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --max-error-fraction 1.0 --no-progress --api completions --seed $seed "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt; T "loadgen $n done $(grep -o '"ttftP50Ms": [0-9.]*' $R/lg-$n.json | head -1)"; }
W="--input-len 1024 --output-len 256"
serve cold
[ $up = 1 ] || { pack; exit 0; }
curl -s http://127.0.0.1:8000/tokenize -H 'Content-Type: application/json' -d "{\"model\": \"$M\", \"prompt\": \"the of and to in\"}" > $R/tokenize.json; T "tokenize $(head -c 200 $R/tokenize.json)"
LG c1 $W --concurrency 1 --num-requests 8 --warmup-requests 1
LG c8 $W --concurrency 8 --num-requests 48 --warmup-requests 8
LG c32 $W --concurrency 32 --num-requests 128 --warmup-requests 32
LG d-c16 --input-len 128 --output-len 512 --concurrency 16 --num-requests 48 --warmup-requests 16
LG c64 $W --concurrency 64 --num-requests 256 --warmup-requests 64
LG long-c16 --input-len 3584 --output-len 128 --concurrency 16 --num-requests 64 --warmup-requests 16
pack
LG c128 $W --concurrency 128 --num-requests 384 --warmup-requests 128
pack
stop
serve cached
[ $up = 1 ] && { LG r-c32 $W --concurrency 32 --num-requests 128 --warmup-requests 32; LG r-c8 $W --concurrency 8 --num-requests 48 --warmup-requests 8; LG r-c1 $W --concurrency 1 --num-requests 8 --warmup-requests 1; }
stop; T end; pack; ls -la $OUT
