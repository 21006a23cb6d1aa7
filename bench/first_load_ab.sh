#!/usr/bin/env bash
# First loads (fresh process, hot page cache) of two eredu builds, A and B, interleaved round
# by round with the baselines of bench/load_baseline in the same rounds, each round in a fresh
# shuffled order (a rotation would give every case the same predecessor, whose freed memory the
# host is taking back), each case starting SETTLE (3) s after the previous one exited: what
# decides whether a change to the fresh-memory path pays, on a noisy machine.
#   A, B       `eredu load PATH --json` of each build (loads[0].seconds)
#   blocks     the Run:ai Model Streamer scheme: 2 threads read() 2 MiB blocks into one fresh
#              malloc buffer (4 KiB pages)
#   touch-4k   first touch of as many fresh bytes, a write per 4 KiB page, all threads
#   touch-huge the same with MADV_HUGEPAGE + MADV_POPULATE_WRITE per 2 MiB
# Prints per case the median and min-max of seconds and, per round, A/B and each eredu against
# blocks and the faster first touch (medians of the within-round ratios); writes JSON lines.
#
# usage: bench/first_load_ab.sh EREDU_A EREDU_B LOAD_BASELINE CHECKPOINT [rounds=7] [out.jsonl]
#   CHECKPOINT  a file, or a directory (its largest weights file is what the baselines read)
#   A_ARGS, B_ARGS  extra `eredu load` arguments of A and B (e.g. B_ARGS="--verify on" with
#                   EREDU_B = EREDU_A: the cost of verification in the same rounds)
#   SETTLE          seconds between cases (default 3); SEED  the shuffle's seed (default 1)
set -euo pipefail
a="$1"; b="$2"; base="$3"; ckpt="$4"; rounds="${5:-7}"; out="${6:-$(mktemp --suffix=.jsonl)}"
: > "$out"
cases=(A B blocks touch-4k touch-huge)
# A directory (a sharded checkpoint, or one file with its checksums.sha256.json) is loaded
# whole; the baselines read its largest weights file.
data="$ckpt"
if [ -d "$ckpt" ]; then
  data=$(find "$ckpt" -maxdepth 1 -type f \( -name '*.safetensors' -o -name '*.gguf' \) -printf '%s %p\n' |
         sort -n | tail -n 1 | cut -d' ' -f2-)
  [ -n "$data" ] || { echo "first_load_ab: no .safetensors or .gguf file in $ckpt" >&2; exit 2; }
fi
bytes=$(stat -c %s "$data")
run_case() {
  case "$1" in
    A) "$a" load "$ckpt" ${A_ARGS:-} --json -q | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["loads"][0]["seconds"])' ;;
    B) "$b" load "$ckpt" ${B_ARGS:-} --json -q | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["loads"][0]["seconds"])' ;;
    blocks) "$base" blocks "$data" --threads 2 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])' ;;
    touch-4k) "$base" populate "$bytes" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])' ;;
    touch-huge) "$base" populate "$bytes" --hugepages | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])' ;;
  esac
}
# A hot run: the checkpoint is read into the page cache before every round.
warm() { if [ -d "$ckpt" ]; then cat "$ckpt"/* > /dev/null; else cat "$ckpt" > /dev/null; fi; }
source "$(dirname "$0")/rounds.sh"
interleave first_load_ab "$rounds" "$out" "" warm : "${cases[@]}"
/usr/bin/python3 - "$out" "$bytes" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
gb = int(sys.argv[2]) / 1e9
by = {}
for r in rows: by.setdefault(r["case"], {})[r["round"]] = r["seconds"]
def mm(v): return f"{st.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})"
for c, v in by.items():
    s = list(v.values())
    print(f"{c:11s} {mm(s)}  {gb / st.median(s):.2f} GB/s")
rounds = sorted(by["A"])
def ratio(name, f):
    v = [f(r) for r in rounds]
    print(f"{name:34s} median {st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
ratio("B speed / A speed", lambda r: by["A"][r] / by["B"][r])
for x in ("A", "B"):
    ratio(f"{x} speed / blocks speed", lambda r: by["blocks"][r] / by[x][r])
    ratio(f"{x} speed / faster first touch", lambda r: min(by["touch-4k"][r], by["touch-huge"][r]) / by[x][r])
print(f"rows: {sys.argv[1]}")
PY
