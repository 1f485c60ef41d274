#!/usr/bin/env bash
# Build the vLLM kit for the GPU machine (../shared/vllm-kit/build-kit.sh's steps) in parts that fit one device call
# beside this checkout's working tree. The shared script sizes its parts from the tree and names them with one digit;
# once the tree (tests/data/vllm) passed about 40 MB its parts became too many for one digit (its `split` fails:
# "output file suffixes exhausted") and, at 25 MB, too large to travel beside the tree. This one writes
# .device-kit/p3/part00, part01, ... of PART_BYTES (default: what the 64 MiB carry leaves beside the tracked files,
# less 4 MiB, at most 19,000,000, as runs 35-36 used) and .device-kit/scripts/.
# Usage, from the project's root:  bash tests/data/vllm/kit-scripts/build-kit.sh [SHARED_KIT_DIR]
# Then one device call per part, back to back, carry [".device-kit/p3/partNN", ".device-kit/scripts"]:
#   bash .device-kit/scripts/receive-part.sh .device-kit/p3/partNN
set -euo pipefail
here=${1:-$(git rev-parse --show-toplevel)/../shared/vllm-kit}
here=$(cd "$here" && pwd)
root=$(git rev-parse --show-toplevel)
dest=.device-kit
cd "$root"
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
python3 -c "import tokenizers" 2>/dev/null || { echo "make_models.py needs the tokenizers package: python3 -m pip install tokenizers" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do plat="$plat --platform ${p}_x86_64"; done
echo "downloading vllm 0.24.0 and the packages the device image lacks"
python3 -m pip download -q --no-deps $plat -d "$work/dl" vllm==0.24.0
python3 -m pip download -q --no-deps $plat -d "$work/whl" -r "$here/device-wheels.txt"
mkdir -p "$work/tree" "$work/kit"
# As the shared script: vLLM unpacked, without FlashAttention 2 (Hopper runs FA3) and the opt-in Rust front end.
(cd "$work/tree" && python3 -m zipfile -e "$work"/dl/vllm-0.24.0-*.whl . && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs)
(cd "$work/tree" && tar czf "$work/kit/vllm-tree.tgz" vllm vllm-0.24.0.dist-info)
mv "$work/whl" "$work/kit/whl"
python3 "$here/make_models.py" "$work/kit/models"
cp -r "$root/operator/kneepoint" "$work/kit/kneepoint"
find "$work/kit" -name __pycache__ -prune -exec rm -rf {} +
cp "$here"/device-setup.sh "$here"/run-*.sh "$work/kit/"
rm -rf "$dest" && mkdir -p "$dest/scripts" "$dest/p3"
cp "$here"/device-setup.sh "$here"/run-*.sh "$here"/receive-part.sh "$dest/scripts/"
tree_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
room=$((64 * 1024 * 1024 - tree_bytes - 4 * 1024 * 1024))
part=${PART_BYTES:-$((room < 19000000 ? room : 19000000))}
[ "$part" -gt 1000000 ] || { echo "the working tree ($tree_bytes bytes) leaves no room for a kit part in 64 MiB" >&2; exit 1; }
(cd "$work/kit" && tar cf - .) | split -b "$part" -d -a 2 - "$dest/p3/part"
ls -la "$dest/p3"
echo "kit ready: $(ls "$dest"/p3/part* | wc -l) parts of at most $part bytes beside a $tree_bytes-byte tree"
