#!/usr/bin/env bash
# Two builds of `eredu` against each other on the same files, interleaved round by round with
# the order alternating, for a change that must not move performance (issue 11: "within
# noise of before"). Per round, for each build: a first `load` (fresh process), `load
# --repeat 3` (loads 2-3: recycled storage), `load --dtype f32 --repeat 3` (recycled, the
# conversion path), `pipeline` (seconds and stall), and `swap` (publish pause p99, request
# p99 during swaps / steady). Prints per build the median [min-max] over the rounds and the
# median of the within-round ratio after / before. Parses the text report, which both
# versions print alike.
#
# usage: bench/before_after.sh BEFORE_ERDU AFTER_ERDU [--rounds 7] [--size 1G] [--dir DIR]
set -euo pipefail

before="${1:?usage: before_after.sh BEFORE_ERDU AFTER_ERDU [--rounds N] [--size S] [--dir DIR]}"
after="${2:?usage: before_after.sh BEFORE_ERDU AFTER_ERDU [--rounds N] [--size S] [--dir DIR]}"
shift 2
rounds=7; size=1G; dir="${EREDU_BENCH_DIR:-${TMPDIR:-/tmp}/eredu-bench}"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?}"; shift 2 ;;
    --size) size="${2:?}"; shift 2 ;;
    --dir) dir="${2:?}"; shift 2 ;;
    *) echo "before_after.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
ck="$dir/before-after-$size.safetensors"; a="$dir/before-after-a.safetensors"; b="$dir/before-after-b.safetensors"
[ -f "$ck" ] || "$after" gen "$ck" --size "$size" -q
[ -f "$a" ] || "$after" gen "$a" --size 16M --seed 1 -q
[ -f "$b" ] || "$after" gen "$b" --size 16M --seed 2 -q
out="$dir/before-after.txt"; : > "$out"

one() {  # build-label binary case args...
  local label="$1" bin="$2" case="$3"; shift 3
  cat "$ck" "$a" "$b" > /dev/null  # the page cache evicts idle files: every case starts hot
  printf '=== %s %s\n' "$label" "$case" >> "$out"
  "$bin" "$@" 2>/dev/null >> "$out" || printf 'FAILED\n' >> "$out"
}
round() {  # label binary
  one "$1" "$2" first load "$ck"
  one "$1" "$2" recycled load "$ck" --repeat 3
  one "$1" "$2" f32 load "$ck" --dtype f32 --repeat 3
  one "$1" "$2" pipeline pipeline "$ck"
  one "$1" "$2" swap swap "$a" "$b" --swaps 20 --requests 200
}
for r in $(seq 1 "$rounds"); do
  printf '### round %s\n' "$r" >> "$out"
  if [ $((r % 2)) = 1 ]; then round before "$before"; round after "$after"; else round after "$after"; round before "$before"; fi
  echo "before_after.sh: round $r of $rounds done" >&2
done

/usr/bin/python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys
text, rounds = open(sys.argv[1]).read(), int(sys.argv[2])
figures = {}  # (label, figure) -> [per round]
for block in text.split("### round ")[1:]:
    for part in block.split("=== ")[1:]:
        head, _, body = part.partition("\n")
        label, case = head.split()
        put = lambda name, v: figures.setdefault((label, name), []).append(v)
        loads = [float(x) for x in re.findall(r"^load(?: \d+)? .* in ([\d.]+) s:", body, re.M)]
        if case == "first" and loads: put("first load s", loads[0])
        if case in ("recycled", "f32") and len(loads) >= 3: put(f"{case} load s", statistics.median(loads[1:]))
        m = re.search(r"^pipeline .* in ([\d.]+) s:", body, re.M)
        if m: put("pipeline s", float(m.group(1)))
        m = re.search(r"stall ([\d.]+) s", body)
        if m and case == "pipeline": put("pipeline stall s", float(m.group(1)))
        m = re.search(r"publish pause\s+p50 \S+ ns, p99 ([\d.]+) ns", body)
        if m: put("publish pause p99 ns", float(m.group(1)))
        m = re.search(r"request p99 .* ratio ([\d.]+)", body)
        if m: put("request p99 ratio", float(m.group(1)))
names = sorted({n for _, n in figures}, key=lambda n: list(dict.fromkeys(n for _, n in figures)).index(n))
fmt = lambda xs: f"{statistics.median(xs):.4g} [{min(xs):.4g}–{max(xs):.4g}]" if xs else "n/a"
print(f"| figure (median [min–max], {rounds} rounds) | before | after | after / before (median of rounds) |")
print("|---|---|---|---|")
for n in names:
    b, a = figures.get(("before", n), []), figures.get(("after", n), [])
    ratios = [y / x for x, y in zip(b, a) if x > 0]
    print(f"| {n} | {fmt(b)} | {fmt(a)} | {statistics.median(ratios):.3f} |" if ratios else f"| {n} | {fmt(b)} | {fmt(a)} | n/a |")
PY
