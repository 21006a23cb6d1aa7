#!/usr/bin/env bash
# The main job on a built-in default: build eredu, generate a realistic synthetic sharded
# checkpoint (Llama-shaped, bf16, 1 GiB, 4 shards), inspect it, and read every tensor
# through the bounded lease pool with verification.
# usage: scripts/demo.sh [size] [output dir]
set -euo pipefail
cd "$(dirname "$0")/.."
size="${1:-1G}"
out="${2:-${TMPDIR:-/tmp}/eredu-demo}"
bash scripts/setup.sh release eredu_cli
eredu=build/release/tools/eredu
if [ ! -f "$out/model.safetensors.index.json" ] || [ "$(cat "$out/.size" 2>/dev/null)" != "$size" ]; then
  rm -rf "$out"
  "$eredu" gen "$out" --size "$size" --shards 4 --seed 7
  echo "$size" > "$out/.size"
fi
echo
echo "== eredu inspect $out (first and last tensors)"
"$eredu" inspect "$out" | { head -6; echo "..."; tail -4; }
echo
echo "== eredu read $out (io_uring, 256 MiB staging budget, verified)"
"$eredu" read "$out"
echo
echo "== the same with a 32 MiB budget and the pread reader"
"$eredu" read "$out" --budget 32M --reader pread
