#!/usr/bin/env bash
# Hot-swap benchmark: `eredu swap A B` (engine::ModelSlot under request load) against the
# targets of the hot-swap issue, plus bench/hot_swap/exchange_bench (the publish primitive
# alone under concurrent readers), in one run:
#   publish pause p99 over the swaps       ≤ 10 µs
#   request p99 during swaps / steady p99  ≤ 1.5   (same run; steady = requests that did not
#                                                   overlap a swap)
#   a failed swap (corrupt copy of B, caught by its checksum) changes no response
# A and B are synthetic bf16 checkpoints (seeds 1 and 2) generated once in the bench directory.
#
# usage: bench/hot_swap.sh [--size 16M] [--swaps 100] [--requests 300] [--concurrency 8]
#                          [--serve-threads 0] [--swap-threads 1] [--quick]
#   --quick          --swaps 10: a sanity run, not a measurement
#   EREDU_BUILD_DIR  take eredu and exchange_bench from this build directory as they are
#                    (default: build/release, built first with scripts/setup.sh)
#   EREDU_BENCH_DIR  where the checkpoints are kept (default: ${TMPDIR:-/tmp}/eredu-bench)
# Exits 1 when a response mismatched or the failed swap changed one; targets only print.
set -euo pipefail

size=16M; swaps=100; requests=300; concurrency=8; serve=0; swap_threads=1
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="${2:?}"; shift 2 ;;
    --swaps) swaps="${2:?}"; shift 2 ;;
    --requests) requests="${2:?}"; shift 2 ;;
    --concurrency) concurrency="${2:?}"; shift 2 ;;
    --serve-threads) serve="${2:?}"; shift 2 ;;
    --swap-threads) swap_threads="${2:?}"; shift 2 ;;
    --quick) swaps=10; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hot_swap.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

dir="${EREDU_BENCH_DIR:-${TMPDIR:-/tmp}/eredu-bench}"
mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
build_override="${EREDU_BUILD_DIR:-}"
[ -n "$build_override" ] && build="$(cd "$build_override" && pwd)"
cd "$(dirname "$0")/.."
if [ -z "$build_override" ]; then
  build=build/release
  log="$(mktemp)"
  if ! bash scripts/setup.sh release eredu_cli exchange_bench >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "hot_swap.sh: building eredu_cli and exchange_bench failed" >&2; exit 1
  fi
  rm -f "$log"
fi
eredu="$build/tools/eredu"; xbench="$build/bench/hot_swap/exchange_bench"
for b in "$eredu" "$xbench"; do [ -x "$b" ] || { echo "hot_swap.sh: $b is missing" >&2; exit 1; }; done

for seed in 1 2; do
  f="$dir/swap-$size-$seed.safetensors"
  if [ ! -f "$f" ]; then
    "$eredu" gen "$f" --size "$size" --seed "$seed" --quiet  # written under a temporary name, then renamed
  fi
done
a="$dir/swap-$size-1.safetensors"; b="$dir/swap-$size-2.safetensors"
cat "$a" "$b" > /dev/null  # page cache: the swap measures loading, not the disk

swap_cmd=("$eredu" swap "$a" "$b" --swaps "$swaps" --requests "$requests" --concurrency "$concurrency"
          --serve-threads "$serve" --swap-threads "$swap_threads" --corrupt --json)
x_cmd=("$xbench" --json)
echo "hot_swap.sh: ${swap_cmd[*]}" >&2
swap_json="$("${swap_cmd[@]}")" || true
echo "hot_swap.sh: ${x_cmd[*]}" >&2
x_json="$("${x_cmd[@]}")"
raw="$dir/hot-swap-results.json"
printf '{"swap":%s,"exchange":%s}\n' "$swap_json" "$x_json" > "$raw"

status=0
python3 - "$raw" "$(nproc)" <<'PY' || status=$?
import json, sys
r = json.load(open(sys.argv[1])); s, x = r["swap"], r["exchange"]
verdict = lambda ok: "met" if ok else "NOT met"
ok_swaps = [w for w in s["swaps"] if w["ok"]]
print(f"checkpoints: {s['tensor_bytes'] / 2**20:.1f} MiB each, {s['tensor_count']} tensors; {sys.argv[2]} CPUs; "
      f"{s['concurrency']} clients, serve threads {s['serve_threads']} (0: on the loop), swap threads {s['swap_threads']}, "
      f"staging {s['budget_bytes'] / 2**20:.0f} MiB")
print(f"requests: y = {s['probe']['tensor']}[0:{s['probe']['rows']}, :]·x; {s['response_count']} responses in {s['seconds']:.1f} s")
loads = sorted(w["load_seconds"] for w in ok_swaps)
if loads:
    print(f"swaps: {len(ok_swaps)} successful, load median {1e3 * loads[len(loads) // 2]:.1f} ms")
print()
p = s["publish_pause"]
print(f"publish pause p99 over {p['count']} swaps: {p['p99_seconds'] * 1e6:.2f} µs (p50 {p['p50_seconds'] * 1e9:.0f} ns, "
      f"max {p['max_seconds'] * 1e6:.2f} µs; target ≤ 10 µs): {verdict(p['count'] > 0 and p['p99_seconds'] <= 10e-6)}")
st, du = s["steady"], s["during_swap"]
us = 1e6
print(f"request p99 during swaps / steady: {s['p99_ratio']:.2f} ({du['p99_seconds'] * us:.0f} / {st['p99_seconds'] * us:.0f} µs; "
      f"p50 {du['p50_seconds'] * us:.0f} / {st['p50_seconds'] * us:.0f} µs; {du['count']} / {st['count']} requests; target ≤ 1.5): "
      f"{verdict(s['p99_ratio'] <= 1.5)}")
f = s["failed_swap"]
print(f"failed swap: rejected with {f['error_kind'] or 'NOTHING'}; {f['response_count']} responses during and after it, "
      f"{f['changed_count']} changed (p99 during it {f['latency']['p99_seconds'] * us:.0f} µs): "
      f"{verdict(f['rejected'] and f['changed_count'] == 0)}")
print(f"every response from exactly one version: {s['mismatch_count']} mismatches of {s['response_count']}: "
      f"{verdict(s['mismatch_count'] == 0)}")
print(f"publish alone, {x['readers']} reader threads loading it: p50 {x['exchange']['p50_ns']} ns, "
      f"p99 {x['exchange']['p99_ns']} ns, max {x['exchange']['max_ns'] / 1e3:.1f} µs; reader load p99 {x['load']['p99_ns']} ns; "
      f"retiring the old pointer p99 {x['retire']['p99_ns'] / 1e3:.1f} µs (waits for readers preempted inside a load)")
print(f"memory: staging high-water {s['staging_high_water_bytes'] / 2**20:.1f} MiB; storage live {s['storage']['live_bytes'] / 2**20:.1f} MiB, "
      f"retained {s['storage']['retained_bytes'] / 2**20:.1f} MiB, {s['storage']['recycled_allocation_count']} recycled blocks; "
      f"peak RSS {s['peak_rss_bytes'] / 2**20:.0f} MiB")
sys.exit(0 if s["ok"] else 1)
PY
echo
echo "reproduce: ${swap_cmd[*]}"
echo "           ${x_cmd[*]}"
echo "raw results: $raw"
exit $status
