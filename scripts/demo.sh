#!/usr/bin/env bash
# The main job on a built-in default: build eredu, generate a realistic synthetic sharded
# checkpoint (Llama-shaped, bf16, 1 GiB, 4 shards), inspect it, read every tensor through
# the bounded lease pool with verification, and load it into CPU tensors through the engine
# (as stored, and cast to f32), then run the load_unit example.
# usage: scripts/demo.sh [size] [output dir]
set -euo pipefail
cd "$(dirname "$0")/.."
size="${1:-1G}"
out="${2:-${TMPDIR:-/tmp}/eredu-demo}"
bash scripts/setup.sh release eredu_cli load_unit
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
echo
echo "== eredu load $out (into CPU tensors, dtype kept; twice: the second reuses the first's storage)"
"$eredu" load "$out" --repeat 2
echo
echo "== eredu load $out --dtype f32 (bf16 -> f32 conversion on oneTBB, 64 MiB staging budget)"
"$eredu" load "$out" --dtype f32 --budget 64M
echo
echo "== examples/load_unit (co_await one block, then the whole model; forward checked against the file)"
build/release/examples/load_unit/load_unit
