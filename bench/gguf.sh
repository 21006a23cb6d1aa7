#!/usr/bin/env bash
# GGUF benchmarks, interleaved round by round (A B, then B A) because these VMs are noisy and
# memory freed seconds earlier is slow to touch again:
#   load     a kept-dtype load of a synthetic GGUF file (Q4_K weights, F32 norms) through the
#            CPU backend vs a safetensors load of the same bytes, into fresh and into recycled
#            storage; target: GGUF within 1.05x (median of the within-round time ratios)
#   dequant  each quantized type to bf16 and f32 (oneTBB-parallel, best kernels) vs a parallel
#            fill of the same output buffer (the write-bandwidth limit, same rounds); target:
#            bf16 >= 0.8x the limit for the K-quants
# The files are generated once into $EREDU_BENCH_DIR (default ${TMPDIR:-/tmp}/eredu-gguf-bench)
# and re-read before each load round (cat > /dev/null) so that both loads are page-cache hot.
# Prints medians with min-max and the ratios.
#
# usage: bench/gguf.sh [size_mib=2048] [rounds=7] [dequant_out_mib=256]
#   EREDU_BUILD_DIR  take gguf_bench from this build directory (default build/release, built first)
set -euo pipefail
cd "$(dirname "$0")/.."
size="${1:-2048}"; rounds="${2:-7}"; out_mib="${3:-256}"
build="${EREDU_BUILD_DIR:-build/release}"
if [ -z "${EREDU_BUILD_DIR:-}" ]; then bash scripts/setup.sh release gguf_bench >/dev/null; fi
bench="$build/bench/gguf_bench"
dir="${EREDU_BENCH_DIR:-${TMPDIR:-/tmp}/eredu-gguf-bench}/${size}M"
if [ ! -f "$dir/model.gguf" ] || [ ! -f "$dir/model.safetensors" ]; then
  "$bench" gen "$dir" "$size" Q4_K
fi
log=$(mktemp)
for r in $(seq 1 "$rounds"); do
  cat "$dir/model.gguf" "$dir/model.safetensors" > /dev/null
  "$bench" load "$dir" 1 "$r" | grep " round " | sed "s/ round 0 / round $r /" >> "$log"  # first file alternates
done
dequant_log=$(mktemp)
"$bench" dequant "$out_mib" "$rounds" Q4_0 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ2_XXS IQ3_S IQ4_XS MXFP4 > "$dequant_log"
grep " round " "$dequant_log" >> "$log"
grep "^kernels:" "$dequant_log" || true
rm -f "$dequant_log"
/usr/bin/python3 - "$log" "$size" "$rounds" <<'PY'
import re, statistics, sys
rates, secs = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"(.*) round (\d+) ([0-9.]+) s ([0-9.]+) GiB/s", line.strip())
    if m:
        rates.setdefault(m.group(1), []).append(float(m.group(4)))
        secs.setdefault(m.group(1), {})[int(m.group(2))] = float(m.group(3))
def med(k): return statistics.median(rates[k])
print(f"GGUF benchmarks ({sys.argv[2]} MiB model, {sys.argv[3]} rounds; shared, noisy machine)")
print(f"{'measurement':<34} {'median GiB/s':>12}  min-max")
for k in sorted(rates):
    v = rates[k]; print(f"{k:<34} {med(k):>12.2f}  {min(v):.2f}-{max(v):.2f}")
for g, s in (("load gguf (dtype kept)", "load safetensors (same bytes)"),
             ("load gguf, recycled storage", "load safetensors, recycled storage")):
    if g not in rates or s not in rates:
        continue
    ratio = med(s) / med(g)
    # The ratio within each round (the two loads back to back, first file alternating) is
    # the verdict: fresh memory makes single loads vary 3x on these VMs.
    paired = sorted(secs[g][r] / secs[s][r] for r in secs[g] if r in secs[s])
    within = statistics.median(paired)
    print(f"\n{g.replace('load gguf', 'GGUF load').replace(' (dtype kept)', '')} time / safetensors: {within:.3f} "
          f"({paired[0]:.3f}-{paired[-1]:.3f}) within rounds, {ratio:.3f} of the medians "
          f"(target <= 1.05: {'met' if within <= 1.05 else 'NOT met'})")
limits = {k: v for k, v in rates.items() if k.startswith("write limit")}
for k in sorted(rates):
    if "->" not in k: continue
    out_type = k.split("-> ")[1]
    lim = [l for l in limits]
    if not lim: continue
    limit = statistics.median([x for l in lim for x in limits[l]])
    kq = k.split(" ")[0] in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
    target = " (target >= 0.8: " + ("met" if med(k) / limit >= 0.8 else "NOT met") + ")" if kq and out_type == "BF16" else ""
    print(f"{k:<20} {med(k) / limit:.2f}x the write limit ({limit:.2f} GiB/s){target}")
PY
rm -f "$log"
