#!/usr/bin/env bash
# PrefetchPipeline against a serial load-then-compute loop over the same layers, measured by
# bench/pipeline/pipeline_bench in one process (see docs/pipeline.md), in two configurations:
#   compute-bound  --tokens 16, reads from the page cache: compute per layer ≫ I/O per layer
#   compute-bound, 1 thread  --tokens 32 --threads 1: the same with one compute (and load)
#                  thread, which leaves the other core to the kernel's read copies
#   I/O-bound      --tokens 1, --cold: every layer's bytes are evicted from the page cache
#                  after use (posix_fadvise DONTNEED), so every read goes to the disk
# Each configuration runs R rounds (serial, then pipeline, after one untimed warm-up pass);
# the figure is pipeline / max(Σ I/O, Σ compute) of the same round (target ≤ 1.10), median
# over the rounds. Also prints the resident high-water against the budget and peak RSS.
#
# usage: bench/pipeline.sh [--rounds 5] [--passes 3] [--layers 16] [--hidden 1024]
#                          [--lookahead 2] [--threads N] [--dir DIR]
#   EREDU_BUILD_DIR  take pipeline_bench from this build directory as it is
#                    (default: build/release, built first with scripts/setup.sh)
#   EREDU_BENCH_DIR  where the checkpoint is generated once and kept (default:
#                    ${TMPDIR:-/tmp}/eredu-bench)
set -euo pipefail

rounds=5; passes=3; layers=16; hidden=1024; lookahead=2; threads="$(nproc)"; dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?}"; shift 2 ;;
    --passes) passes="${2:?}"; shift 2 ;;
    --layers) layers="${2:?}"; shift 2 ;;
    --hidden) hidden="${2:?}"; shift 2 ;;
    --lookahead) lookahead="${2:?}"; shift 2 ;;
    --threads) threads="${2:?}"; shift 2 ;;
    --dir) dir="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "pipeline.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
dir="${dir:-${EREDU_BENCH_DIR:-${TMPDIR:-/tmp}/eredu-bench}}"
mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
build_override="${EREDU_BUILD_DIR:-}"
if [ -n "$build_override" ]; then
  build="$(cd "$build_override" 2>/dev/null && pwd)" ||
    { echo "pipeline.sh: EREDU_BUILD_DIR=$build_override is not a directory" >&2; exit 1; }
fi
cd "$(dirname "$0")/.."
if [ -z "$build_override" ]; then
  build=build/release
  log="$(mktemp)"
  if ! bash scripts/setup.sh release pipeline_bench >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "pipeline.sh: building pipeline_bench in build/release failed" >&2; exit 1
  fi
  rm -f "$log"
fi
bench="$build/bench/pipeline/pipeline_bench"
[ -x "$bench" ] || { echo "pipeline.sh: $bench is missing (build the pipeline_bench target in $build)" >&2; exit 1; }

file="$dir/mlp-${layers}x${hidden}.safetensors"
common=("$file" --generate --layers "$layers" --hidden "$hidden" --lookahead "$lookahead" --passes "$passes"
        --rounds "$rounds" --json)
results="$dir/pipeline-results.jsonl"; : > "$results"
run() {  # NAME ARGS...: runs one configuration, prints its table, keeps its JSON line
  local name="$1"; shift
  echo "== $name: $bench ${common[*]} $*" >&2
  local out; out="$("$bench" "${common[@]}" "$@")"
  printf '%s\n' "$out" | sed '$d' >&2
  printf '{"config":"%s","r":%s}\n' "$name" "${out##*$'\n'}" >> "$results"
}
run compute-bound --tokens 16 --threads "$threads"
run "compute-bound, 1 thread" --tokens 32 --threads 1
run io-bound --tokens 1 --cold --threads "$threads"

python3 - "$results" "$(nproc)" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"\n{sys.argv[2]} CPUs; ratio = pipeline / max(Σ I/O, Σ compute) of the same round, median (min–max)")
print("| configuration | layer MiB | tokens | threads | reads | Σ I/O s | Σ compute s | serial s | pipeline s | ratio | target ≤ 1.10 | high-water / budget MiB | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for row in rows:
    r = row["r"]; ratios = [x["ratio"] for x in r["rounds"]]
    med = sorted(r["rounds"], key=lambda x: x["ratio"])[len(ratios) // 2]
    print(f"| {row['config']} | {r['layer_bytes'] / 2**20:.1f} | {r['tokens']} | {r['threads']} | {'cold' if r['cold'] else 'page cache'} | "
          f"{med['io_s']:.3f} | {med['compute_s']:.3f} | {med['serial_s']:.3f} | {med['pipeline_s']:.3f} | "
          f"{r['median_ratio']:.3f} ({min(ratios):.3f}–{max(ratios):.3f}) | {'met' if r['median_ratio'] <= 1.10 else 'NOT met'} | "
          f"{r['resident_high_water'] / 2**20:.1f} / {r['budget'] / 2**20:.1f} | {r['peak_rss_bytes'] / 2**20:.0f} |")
PY
echo "raw results: $results"
