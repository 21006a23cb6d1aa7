#!/usr/bin/env bash
# `eredu load` (every tensor of a synthetic bf16 checkpoint into CPU tensors) against the limits
# of DESIGN.md "What fast means here", measured by bench/load_baseline in the same run and
# interleaved round by round, because memory freed more than ~2 s earlier is slow to touch
# again and these machines are noisy:
#   first load     fresh `eredu load` process, one load     vs (b) populate: first touch of as
#                                                               many fresh bytes on all threads,
#                                                               and (c) malloc + one pread loop
#   recycled load  `eredu load --repeat 3`, loads 2..3      vs (a) pread into a populated buffer
#   f32 conversion `--dtype f32 --repeat 3`, 1 and 2 threads, recycled loads
#                                                           vs (d) mapped-widen: the same widening
#                                                               from the page cache in a tight loop
# Every run that reads the file re-reads it first (cat > /dev/null): the VM evicts page cache
# that sits idle for about a minute. Prints medians with min-max, the targets as met / NOT met,
# and the commands to reproduce one round.
#
# usage: bench/load.sh [size=4G] [runs=5] [dir] [--runs R] [--dir DIR] [--quick]
#   --quick          512M and 2 rounds unless given: a sanity run, not a measurement
#   EREDU_BUILD_DIR  take eredu and load_baseline from this build directory as they are
#                    (default: build/release, built first with scripts/setup.sh)
#   EREDU_BENCH_DIR  where the checkpoint is generated once and kept (default:
#                    ${TMPDIR:-/tmp}/eredu-bench, the checkpoint bench/read.sh uses too)
# Exits 3 when the eredu under test has no `load` command: the baselines still run and print.
set -euo pipefail

size=""; runs=""; dir=""; quick=0; positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="${2:?--runs wants a count}"; shift 2 ;;
    --dir) dir="${2:?--dir wants a directory}"; shift 2 ;;
    --size) size="${2:?--size wants a size such as 4G}"; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "load.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
[ ${#positional[@]} -gt 0 ] && size="${size:-${positional[0]}}"
[ ${#positional[@]} -gt 1 ] && runs="${runs:-${positional[1]}}"
[ ${#positional[@]} -gt 2 ] && dir="${dir:-${positional[2]}}"
[ ${#positional[@]} -gt 3 ] && { echo "load.sh: too many arguments (see --help)" >&2; exit 2; }
if [ $quick = 1 ]; then size="${size:-512M}"; runs="${runs:-2}"; fi
size="${size:-4G}"; runs="${runs:-5}"
dir="${dir:-${EREDU_BENCH_DIR:-${TMPDIR:-/tmp}/eredu-bench}}"
case "$runs" in ''|*[!0-9]*|0) echo "load.sh: runs must be a positive count, not '$runs'" >&2; exit 2 ;; esac

# Paths given relative to the caller's directory stay so after the cd to the repository.
mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
build_override="${EREDU_BUILD_DIR:-}"
if [ -n "$build_override" ]; then
  build="$(cd "$build_override" 2>/dev/null && pwd)" ||
    { echo "load.sh: EREDU_BUILD_DIR=$build_override is not a directory" >&2; exit 1; }
fi
cd "$(dirname "$0")/.."

if [ -z "$build_override" ]; then
  build=build/release
  log="$(mktemp)"
  if ! bash scripts/setup.sh release eredu_cli load_baseline >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    echo "load.sh: building eredu_cli and load_baseline in build/release failed" >&2; exit 1
  fi
  rm -f "$log"
fi
eredu="$build/tools/eredu"; base="$build/bench/load_baseline"
for b in "$eredu" "$base"; do
  [ -x "$b" ] || { echo "load.sh: $b is missing (build the eredu_cli and load_baseline targets in $build)" >&2; exit 1; }
done

# The lead's `eredu load` may not be in every build yet: run the baselines alone then.
have_load=1
probe="$("$eredu" load 2>&1 || true)"
case "$probe" in *"unknown command 'load'"*) have_load=0 ;; esac
if [ $have_load = 0 ]; then
  echo "load.sh: NOTE: $eredu has no 'load' command yet; measuring the baselines only" >&2
fi

file="$dir/model-$size.safetensors"
if [ ! -f "$file" ]; then
  echo "load.sh: generating $file (bf16, 1 shard, seed 3)" >&2
  # Generated under another name so an interrupted run never leaves a truncated checkpoint.
  "$eredu" gen "$file" --size "$size" --seed 3 --quiet  # written under a temporary name, then renamed
fi
file_bytes="$(stat -c %s "$file")"

results="$dir/load-results-$size.jsonl"; : > "$results"
commands="$dir/load-commands-$size.txt"; : > "$commands"
round=0

# Re-reads the checkpoint so the next run finds it in the page cache.
warm() { cat "$file" > /dev/null; }

# Runs one case (the command after CASE) and appends {"case","round","r"} to the results; the
# first round also records the command line for the reproduce section. Stops on failure.
run_case() {
  local case="$1"; shift
  local out err
  err="$(mktemp)"
  if ! out="$("$@" 2>"$err")"; then
    echo "load.sh: round $round, $case failed: $*" >&2; cat "$err" >&2; rm -f "$err"; exit 1
  fi
  rm -f "$err"
  out="${out##*$'\n'}"  # the JSON object is the last line
  echo "{\"case\":\"$case\",\"round\":$round,\"r\":$out}" >> "$results"
  if [ "$round" = 1 ]; then
    { [ "$case" = populate ] || printf 'cat %q > /dev/null; ' "$file"; printf '%q ' "$@"; echo; } >> "$commands"
  fi
}

for round in $(seq "$runs"); do
  echo "load.sh: round $round/$runs" >&2
  # The fresh-memory trio back to back, then the recycled pair, then the conversions.
  if [ $have_load = 1 ]; then warm; run_case first "$eredu" load "$file" --json; fi
  run_case populate "$base" populate "$file_bytes"
  warm; run_case malloc_pread "$base" malloc-pread "$file"
  if [ $have_load = 1 ]; then warm; run_case recycled "$eredu" load "$file" --repeat 3 --json; fi
  warm; run_case populated_pread "$base" populated-pread "$file"
  if [ $have_load = 1 ]; then
    warm; run_case f32_t1 "$eredu" load "$file" --dtype f32 --threads 1 --repeat 3 --json
    warm; run_case f32_t2 "$eredu" load "$file" --dtype f32 --threads 2 --repeat 3 --json
  fi
  warm; run_case widen_t1 "$base" mapped-widen "$file" --threads 1 --hugepages
  warm; run_case widen_t2 "$base" mapped-widen "$file" --threads 2 --hugepages
done

thp="$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
python3 - "$results" "$size" "$runs" "$(nproc)" "$thp" <<'PY'
import json, statistics, sys
path, size, runs, cpus, thp = sys.argv[1:6]
by = {}
for line in open(path):
    row = json.loads(line)
    by.setdefault(row["case"], []).append(row["r"])

def recycled(r, key):
    """The recycled figure of one --repeat run: the median over loads 2..N."""
    loads = r["loads"][1:]
    if not loads:
        sys.exit(f"load.sh: a --repeat run reported {len(r['loads'])} load(s); loads 2.. are needed")
    return statistics.median(l[key] for l in loads)

def first(r, key):
    """The single load of a fresh process."""
    return r["loads"][0][key]

def plain(r, key):
    """A baseline's own figure."""
    return r[key]

cases = [  # (case, how to read one run, label)
    ("first", first, "first load: `eredu load`, fresh process"),
    ("recycled", recycled, "recycled load: `eredu load --repeat 3`, loads 2–3"),
    ("populated_pread", plain, "(a) pread into a populated buffer"),
    ("populate", plain, "(b) first touch of fresh memory"),
    ("malloc_pread", plain, "(c) malloc + one pread loop, 1 thread"),
    ("f32_t1", recycled, "bf16→f32, 1 thread, recycled"),
    ("f32_t2", recycled, "bf16→f32, 2 threads, recycled"),
    ("widen_t1", plain, "(d) bf16→f32 widening limit, mapped page cache → populated huge pages"),
    ("widen_t2", plain, "(d) bf16→f32 widening limit, mapped page cache → populated huge pages"),
]

def stats(case, key="gb_per_s"):
    """(median, min, max) of a case over the rounds, or None when it did not run."""
    how = dict((c, h) for c, h, _ in cases)[case]
    v = [how(r, key) for r in by.get(case, [])]
    return (statistics.median(v), min(v), max(v)) if v else None

def threads(case):
    """The thread count a case reported."""
    runs_ = by.get(case)
    return runs_[0].get("threads", "?") if runs_ else "?"

print(f"checkpoint: {size} bf16 synthetic, 1 shard; {runs} rounds; {cpus} CPUs; THP {thp}")
print("GB/s are 10^9 source bytes per second; eredu rates count the checkpoint's tensor bytes")
print()
print("| case | threads | median GB/s | min–max | median s |")
print("|---|---|---|---|---|")
for case, _, label in cases:
    g, s = stats(case), stats(case, "seconds")
    if g:
        print(f"| {label} | {threads(case)} | {g[0]:.2f} | {g[1]:.2f}–{g[2]:.2f} | {s[0]:.3f} |")
print()

def verdict(ok):
    """The word for a target."""
    return "met" if ok else "NOT met"

def ratio_at_least(name, num, den, target):
    """Prints median(num) / median(den) against a lower bound."""
    a, b = stats(num), stats(den)
    if not a or not b:
        print(f"{name}: not measured"); return
    r = a[0] / b[0]
    print(f"{name}: {r:.2f} ({a[0]:.2f} / {b[0]:.2f} GB/s; target ≥ {target:.2f}): {verdict(r >= target)}")

ratio_at_least("first load / (b) populate", "first", "populate", 0.8)
ratio_at_least("first load / (c) malloc-pread", "first", "malloc_pread", 1.5)
ratio_at_least("recycled load / (a) populated-pread", "recycled", "populated_pread", 0.9)
ratio_at_least("f32 conversion, 2 threads / 1 thread", "f32_t2", "f32_t1", 1.8)
w1, w2 = stats("widen_t1"), stats("widen_t2")
if w1 and w2:
    # The same ratio for the machine's own limit: a conversion cannot scale past it.
    print(f"  the widening limit (d) itself, 2 threads / 1 thread: {w2[0] / w1[0]:.2f} "
          f"({w2[0]:.2f} / {w1[0]:.2f} GB/s)")
    for case, w in (("f32_t1", w1), ("f32_t2", w2)):
        e = stats(case)
        if e:
            print(f"  eredu {case} / (d) at the same threads: {e[0] / w[0]:.2f}")

conv, keep = stats("f32_t2", "seconds"), stats("recycled", "seconds")
if conv and keep:
    same = {r["tensor_bytes"] for r in by["f32_t2"]} == {r["tensor_bytes"] for r in by["recycled"]}
    r = conv[0] / keep[0]
    note = "" if same else " (WARNING: the source bytes differ)"
    print(f"f32 conversion (2 threads) / keep-dtype recycled time: {r:.2f} ({conv[0]:.3f} / {keep[0]:.3f} s; "
          f"target ≤ 1.15): {verdict(r <= 1.15 and same)}{note}")
    wt, at = stats("widen_t2", "seconds"), stats("populated_pread", "seconds")
    if wt and at:
        # The same ratio for the limits: widening writes twice the bytes a copy writes.
        print(f"  the limits' own ratio, (d) widening at 2 threads / (a) copy: {wt[0] / at[0]:.2f} "
              f"({wt[0]:.3f} / {at[0]:.3f} s)")
else:
    print("f32 conversion (2 threads) / keep-dtype recycled time: not measured")

if by.get("first"):
    mib = 2**20
    worst = max(by["first"], key=lambda r: r["peak_rss_bytes"])
    bound = worst["output_bytes"] + worst["budget_bytes"] + 64 * mib
    print(f"peak RSS of the first-load process: {worst['peak_rss_bytes'] / mib:.0f} MiB (max over rounds; "
          f"bound = {worst['output_bytes'] / mib:.0f} MiB model + {worst['budget_bytes'] / mib:.0f} MiB budget + 64 MiB "
          f"= {bound / mib:.0f} MiB): {verdict(worst['peak_rss_bytes'] <= bound)}")
    hw = max(r["staging_high_water_bytes"] for r in by["first"])
    print(f"staging high-water: max {hw / mib:.1f} MiB of the {worst['budget_bytes'] / mib:.0f} MiB budget")
else:
    print("peak RSS of the first-load process: not measured")
if by.get("f32_t2"):
    # Conversions read mapped page-cache pages, which count in RSS: bounded by the windows.
    mib = 2**20
    worst = max(by["f32_t1"] + by["f32_t2"], key=lambda r: r["peak_rss_bytes"])
    bound = worst["output_bytes"] + worst["budget_bytes"] + 64 * mib
    print(f"peak RSS of the f32 load processes: {worst['peak_rss_bytes'] / mib:.0f} MiB (bound = "
          f"{worst['output_bytes'] / mib:.0f} MiB f32 model + {worst['budget_bytes'] / mib:.0f} MiB budget + 64 MiB "
          f"= {bound / mib:.0f} MiB): {verdict(worst['peak_rss_bytes'] <= bound)}")
PY

echo
whole="bench/load.sh $size --runs $runs --dir $dir"
[ -n "$build_override" ] && whole="EREDU_BUILD_DIR=$build $whole"
echo "reproduce, from the repository root (one round; all $runs interleaved rounds: $whole):"
sed 's/^/  /' "$commands"
echo "raw results: $results"
if [ $have_load = 0 ]; then
  echo "load.sh: eredu load is missing from $eredu: only the baselines were measured" >&2
  exit 3
fi
