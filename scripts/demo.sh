#!/usr/bin/env bash
# The main job on a built-in default: build eredu, generate a realistic synthetic sharded
# checkpoint (Llama-shaped, bf16, 1 GiB, 4 shards, with a SHA-256 sidecar), and show eredu's
# three uses on it:
#   1. co_await loading: read every tensor through the bounded lease pool (verified), and
#      load it into CPU tensors through the engine (twice: the second reuses the storage);
#   2. a prefetch pipeline: stream its decoder layers within a budget of 3 layers, computing
#      with each layer while the next ones load;
#   3. hot-swap: serve requests while swapping to a second version (another seed, same
#      shapes) and back, then attempt a swap to a corrupted copy, which is rejected while the
#      serving version keeps answering.
# Ends with a one-screen summary. After the first build, the three uses take well under a
# minute on 2 cores.
# usage: scripts/demo.sh [size] [output dir]
set -euo pipefail
cd "$(dirname "$0")/.."
size="${1:-1G}"
out="${2:-${TMPDIR:-/tmp}/eredu-demo}"
bash scripts/setup.sh release eredu_cli
eredu=build/release/tools/eredu
a="$out/a" b="$out/b"
if [ ! -f "$a/model.safetensors.index.json" ] || [ ! -f "$b/checksums.sha256.json" ] ||
   [ "$(cat "$out/.size" 2>/dev/null)" != "$size" ]; then
  rm -rf "$out"
  mkdir -p "$out"
  "$eredu" gen "$a" --size "$size" --shards 4 --seed 7 --checksums
  "$eredu" gen "$b" --size "$size" --shards 4 --seed 8 --checksums --quiet
  echo "$size" > "$out/.size"
fi
json="$out/json"
mkdir -p "$json"
start=$(date +%s)

echo
echo "== eredu inspect $a (first and last tensors)"
"$eredu" inspect "$a" | { head -6; echo "..."; tail -4; }

echo
echo "== 1. loading — eredu read $a (io_uring, 256 MiB staging budget, verified against pread)"
"$eredu" read "$a"
"$eredu" read "$a" --json > "$json/read.json"
echo
echo "== 1. loading — eredu load $a (into CPU tensors through the engine; the second load reuses the first's storage)"
"$eredu" load "$a" --repeat 2
"$eredu" load "$a" --json > "$json/load.json"

echo
echo "== 2. prefetch pipeline — eredu pipeline $a (3 layers resident at most, 2 passes, a matvec per weight)"
"$eredu" pipeline "$a" --lookahead 2 --passes 2
"$eredu" pipeline "$a" --lookahead 2 --passes 2 --json > "$json/pipeline.json"

echo
echo "== 3. hot-swap — eredu swap $a $b --corrupt (requests served throughout; A -> B -> A, then a corrupt copy of B;"
echo "   every tensor's SHA-256 verified before each publication: --verify require)"
"$eredu" swap "$a" "$b" --swaps 2 --requests 1000 --corrupt --verify require --json > "$json/swap.json"
python3 - "$json/swap.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
us = 1e6
print(f"  {'phase':<14}{'requests':>9}{'p50 µs':>10}{'p99 µs':>10}  generations")
for ph in s["phases"]:
    lat = ph["latency"]
    print(f"  {ph['name']:<14}{lat['count']:>9}{lat['p50_seconds'] * us:>10.0f}{lat['p99_seconds'] * us:>10.0f}  {ph['generations']}")
for w in s["swaps"]:
    if w["ok"]:
        print(f"  swap to {w['target']} -> generation {w['generation']}: load {w['load_seconds']:.2f} s, "
              f"verify {w['verify_seconds']:.2f} s ({w['checksum_count']} digests), canary {w['canary_seconds']:.2f} s, "
              f"publish pause {w['publish_pause_seconds'] * 1e9:.0f} ns")
    else:
        print(f"  swap to {w['target']} rejected [{w['error']['kind']}]: {w['error']['message']}")
EOF

elapsed=$(( $(date +%s) - start ))
echo
echo "== summary ($elapsed s for the three uses)"
python3 - "$json" <<'EOF'
import json, os, sys
d = sys.argv[1]
def load(name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)
def gib(x): return x / 2**30
def mib(x): return x / 2**20
r, l, p, s = load("read.json"), load("load.json"), load("pipeline.json"), load("swap.json")
print(f"  1. read      {gib(r['bytes']):.2f} GiB at {r['gb_per_s']:.2f} GB/s through a {mib(r['budget_bytes']):.0f} MiB staging pool "
      f"(high-water {mib(r['staging_high_water_bytes']):.0f} MiB); {r['mismatch_count']} tensors differ from an independent pread")
print(f"     load      {gib(l['bytes']):.2f} GiB into CPU tensors at {l['loads'][0]['gb_per_s']:.2f} GB/s; "
      f"peak RSS {mib(l['peak_rss_bytes']):.0f} MiB")
print(f"  2. pipeline  {p['unit_count']} layers x {p['pass_count']} passes streamed at {p['gb_per_s']:.2f} GB/s; resident high-water "
      f"{mib(p['resident_high_water_bytes']):.0f} of a {mib(p['budget_bytes']):.0f} MiB budget (the layers total "
      f"{mib(p['pass_bytes']):.0f} MiB); consumer stalled {p['stall_seconds']:.3f} s")
f = s["failed_swap"]
print(f"  3. hot-swap  {sum(1 for w in s['swaps'] if w['ok'])} swaps under {s['concurrency']} clients: publish pause p99 "
      f"{s['publish_pause']['p99_seconds'] * 1e9:.0f} ns, request p99 during swaps / steady {s['p99_ratio']:.2f}; corrupt copy "
      f"rejected with {f['error_kind']}, {f['changed_count']} of {f['response_count']} responses changed; "
      f"{s['mismatch_count']} of {s['response_count']} responses not from exactly one version")
ok = r['mismatch_count'] == 0 and p['within_budget'] and s['ok'] and not s['verified_nothing']
print("  all good" if ok else "  SOMETHING FAILED: see above")
EOF
