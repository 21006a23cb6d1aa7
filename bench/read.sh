#!/usr/bin/env bash
# `eredu read` of a multi-GiB synthetic checkpoint against baselines measured in the same
# run, interleaved (A B B A ...) because these machines are noisy:
#   hot:  pread of the same bytes into one reused request-sized buffer (the copy ceiling)
#   cold: (when /proc/sys/vm/drop_caches is writable) the best O_DIRECT io_uring bandwidth
#         fio reaches on the same file over request sizes 1M/4M and depths 1/4/8
# Prints medians and min-max; staging high-water and peak RSS come from eredu's summary.
# usage: bench/read.sh [size=4G] [runs=7] [dir=/tmp/eredu-bench]
set -euo pipefail
cd "$(dirname "$0")/.."
size="${1:-4G}"; runs="${2:-7}"; dir="${3:-${TMPDIR:-/tmp}/eredu-bench}"
bash scripts/setup.sh release eredu_cli pread_baseline >/dev/null
eredu=build/release/tools/eredu; base=build/release/bench/pread_baseline
mkdir -p "$dir"; file="$dir/model-$size.safetensors"
[ -f "$file" ] || "$eredu" gen "$file" --size "$size" --seed 3 --quiet
results="$dir/results.jsonl"; : > "$results"
warm() { cat "$file" > /dev/null; }
can_drop=0; [ -w /proc/sys/vm/drop_caches ] && can_drop=1
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

hot_eredu() { warm; echo "{\"case\":\"hot_eredu\",\"r\":$("$eredu" read "$file" --verify off --json)}" >> "$results"; }
hot_pread() { warm; echo "{\"case\":\"hot_pread\",\"r\":$("$base" "$file")}" >> "$results"; }
# Hot rounds first, in alternating order (eredu-pread, pread-eredu, ...), each run right after
# a `cat` of the cached file, so neither side always runs in the same memory state. (This
# script used to run hot eredu, hot pread, cold eredu in every round: each hot eredu run but
# the first then followed a drop and refill of the page cache, and those runs scattered most,
# down to 4.6 GB/s against pread's 12.1 minimum in the same run.)
for i in $(seq "$runs"); do
  if [ $((i % 2)) = 1 ]; then hot_eredu; hot_pread; else hot_pread; hot_eredu; fi
done
if [ $can_drop = 1 ]; then
  for i in $(seq "$runs"); do
    drop
    echo "{\"case\":\"cold_eredu\",\"r\":$("$eredu" read "$file" --verify off --json)}" >> "$results"
  done
fi
if [ $can_drop = 1 ] && command -v fio >/dev/null; then
  for bs in 1M 4M; do for qd in 1 4 8; do
    drop
    gbps=$(fio --name=cold --filename="$file" --ioengine=io_uring --direct=1 --rw=read --bs=$bs \
             --iodepth=$qd --output-format=json 2>/dev/null |
           python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["jobs"][0]["read"]["bw_bytes"]/1e9)')
    echo "{\"case\":\"cold_fio_${bs}_qd${qd}\",\"r\":{\"gb_per_s\":$gbps}}" >> "$results"
  done; done
fi

python3 - "$results" "$size" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows: by.setdefault(r["case"], []).append(r["r"])
def s(case, key="gb_per_s"):
    v = [x[key] for x in by.get(case, [])]
    return (statistics.median(v), min(v), max(v)) if v else None
def line(name, st):
    print(f"| {name} | {st[0]:.2f} | {st[1]:.2f}–{st[2]:.2f} |")
print(f"checkpoint: {sys.argv[2]} bf16 synthetic, {len(by.get('hot_eredu', []))} runs each, GB/s (1e9 bytes/s)")
print("| case | median GB/s | min–max |"); print("|---|---|---|")
for c in ["hot_eredu", "hot_pread", "cold_eredu"]:
    if c in by: line(c, s(c))
fio = {c: s(c)[0] for c in by if c.startswith("cold_fio")}
for c, v in sorted(fio.items()): print(f"| {c} | {v:.2f} | |")
he, hp = s("hot_eredu"), s("hot_pread")
print(f"\nhot ratio eredu/pread (medians): {he[0]/hp[0]:.2f}  (target >= 0.90)")
if "cold_eredu" in by and fio:
    best = max(fio.values()); ce = s("cold_eredu")
    print(f"cold ratio eredu/best fio O_DIRECT ({max(fio, key=fio.get)}): {ce[0]/best:.2f}  (target >= 0.90)")
hw = [x["staging_high_water_bytes"] for x in by["hot_eredu"]]; rss = [x["peak_rss_bytes"] for x in by["hot_eredu"]]
bud = by["hot_eredu"][0]["budget_bytes"]
print(f"staging high-water max {max(hw)/2**20:.1f} MiB of {bud/2**20:.0f} MiB budget; peak RSS max {max(rss)/2**20:.0f} MiB")
PY
