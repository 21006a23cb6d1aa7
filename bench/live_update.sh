#!/usr/bin/env bash
# Live updates (docs/performance.md, "Live updates"): runs bench/distributed/live_update under
# mpirun -np 3 (rank 0 publishes a Llama-shaped bf16 model from memory, ranks 1-2 are a
# tensor-parallel pair) and prints, per contender, the median and min-max over the rounds of
# its seconds and of each rank's GB/s, and the update's ratios to MPI_Bcast and to the hot-file
# swap; and delta updates with 1 % and 10 % of the 64 KiB blocks changed, and with 1.5 % of the
# values changed at random, and with 78 % of the values moved by a few units in the last place
# (drift), against the full update of the same round; and the full update
# over the two-sided transport (update2) against the one-sided one; and the full update into an
# InPlaceModelSlot (inplace) against the update, with its readers' pause; and a 1 % delta written
# into another InPlaceModelSlot as a patch (patch1) against delta1 and inplace. Rows (one JSON
# line per round and contender) go to OUT.
#
# usage: [ONLY=update,update2,...] [TRANSPORT=two_sided] bench/live_update.sh BUILD_DIR [size MiB=2048] [rounds=7] [out.jsonl]
# ONLY times just those contenders (update, bcast, file, delta1, delta10, sparse, update2, drift, inplace, patch1).
# TRANSPORT is the live transport of every contender but update2 (default one_sided).
# Hold /tmp/eredu-build.lock around it on a shared machine so that no build runs meanwhile.
set -euo pipefail
build="$1"; size="${2:-2048}"; rounds="${3:-7}"; out="${4:-$(mktemp --suffix=.jsonl)}"
read -r -a mpirun <<< "mpirun ${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1} -np 3"
"${mpirun[@]}" "$build/bench/distributed/live_update" --size-mib "$size" --rounds "$rounds" \
  --dir "${DIR:-/dev/shm/eredu-live}" ${ONLY:+--only "$ONLY"} ${TRANSPORT:+--transport "$TRANSPORT"} 2>/dev/null | grep '^{' > "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
summary = next(r for r in rows if "model_bytes" in r)
model = summary["model_bytes"]
read = summary.get("rank_read_bytes", model / 2)
def stat(case, key="seconds"):
    v = [r[key] for r in rows if r.get("case") == case]
    return statistics.median(v), min(v), max(v), v
def have(case):
    return any(r.get("case") == case for r in rows)
print(f"model {model / 2**30:.2f} GiB, each rank reads {read / 2**30:.2f} GiB; {len({r['round'] for r in rows if 'round' in r})} rounds")
per_rank = {"update": read, "file": read, "bcast": model}
for case in ("update", "bcast", "file"):
    if not have(case):
        continue
    m, lo, hi, _ = stat(case)
    b = per_rank[case]
    print(f"{case:7s} {m:.3f} s ({lo:.3f}-{hi:.3f})   {b / m / 1e9:.2f} GB/s per rank ({b / hi / 1e9:.2f}-{b / lo / 1e9:.2f})")
for key in ("publish_s", "open_s", "digests_s", "load_s", "canary_s", "commit_s"):
    if not have("update"):
        break
    m, lo, hi, _ = stat("update", key)
    print(f"  update {key:10s} {m:.4f} s ({lo:.4f}-{hi:.4f})")
u = {r["round"]: r["seconds"] for r in rows if r.get("case") == "update"}
bc = {r["round"]: r["seconds"] for r in rows if r.get("case") == "bcast"}
f = {r["round"]: r["seconds"] for r in rows if r.get("case") == "file"}
if u and bc:
    bw = [(read / u[k]) / (model / bc[k]) for k in u]
    tm = [bc[k] / u[k] for k in u]
    print(f"update bandwidth / MPI_Bcast bandwidth (per round): {statistics.median(bw):.2f} ({min(bw):.2f}-{max(bw):.2f})")
    print(f"MPI_Bcast time / update time (per round):           {statistics.median(tm):.2f} ({min(tm):.2f}-{max(tm):.2f})")
if u and f:
    fl = [f[k] / u[k] for k in u]
    print(f"hot-file swap time / update time (per round):       {statistics.median(fl):.2f} ({min(fl):.2f}-{max(fl):.2f})")
def against_update(case, what):
    """A full update's seconds, and its time over the (one-sided) update's of the same round."""
    m, lo, hi, _ = stat(case)
    c = {r["round"]: r["seconds"] for r in rows if r.get("case") == case}
    ratio = [c[k] / u[k] for k in c if k in u]
    versus = (f"; {what} (per round) {statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
              if ratio else "")
    print(f"{case:7s} {m:.3f} s ({lo:.3f}-{hi:.3f})   {read / m / 1e9:.2f} GB/s per rank{versus}")
if have("update2") and u:
    against_update("update2", "two-sided time / one-sided")
    m, lo, hi, _ = stat("update2", "load_s")
    print(f"  update2 load_s     {m:.4f} s ({lo:.4f}-{hi:.4f})")
if have("inplace"):
    against_update("inplace", "in-place time / update")
    for key in ("load_s", "canary_s", "pause_s"):
        m, lo, hi, _ = stat("inplace", key)
        print(f"  inplace {key:10s} {m:.4f} s ({lo:.4f}-{hi:.4f})")
    print("  inplace per round (seconds, staging blocks fresh from the system on the rank with most): " +
          ", ".join(f"{r['seconds']:.2f} ({r['fresh_blocks']:.0f})" for r in rows if r.get("case") == "inplace"))
    print(f"  inplace serving: steady p99 {summary['inplace_steady_p99_us']} us, during updates p99 "
          f"{summary['inplace_during_p99_us']} us, longest wait {summary['inplace_max_pause_us'] / 1e3:.1f} ms, "
          f"mixed responses {summary['inplace_mixed_responses']:.0f}")
for case in ("delta1", "delta10", "sparse", "drift"):
    if not have(case):
        continue
    m, lo, hi, _ = stat(case)
    d = {r["round"]: r for r in rows if r.get("case") == case}
    ratio = [d[k]["seconds"] / u[k] for k in d if k in u]
    moved = [d[k]["transferred_bytes"] / read for k in d]
    versus = (f"; time / full update (per round) {statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
              if ratio else "")
    print(f"{case:7s} {m:.3f} s ({lo:.3f}-{hi:.3f}){versus}; bytes read / shard {statistics.median(moved):.4f} "
          f"({min(moved):.4f}-{max(moved):.4f}); all rounds deltas: {all(d[k]['delta'] for k in d)}")
    for key in ("publish_s", "load_s"):
        m, lo, hi, _ = stat(case, key)
        print(f"  {case} {key:10s} {m:.4f} s ({lo:.4f}-{hi:.4f})")
if have("patch1"):
    m, lo, hi, _ = stat("patch1")
    p = {r["round"]: r for r in rows if r.get("case") == "patch1"}
    line = f"patch1  {m:.3f} s ({lo:.3f}-{hi:.3f})"
    for other in ("delta1", "inplace", "update"):
        o = {r["round"]: r["seconds"] for r in rows if r.get("case") == other}
        ratio = [p[k]["seconds"] / o[k] for k in p if k in o]
        if ratio:
            line += f"; / {other} (per round) {statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
    print(line)
    written = [p[k]["written_bytes"] / read for k in p]
    moved = [p[k]["transferred_bytes"] / read for k in p]
    fresh = ", ".join(str(round(p[k]["fresh_blocks"])) for k in sorted(p))
    print(f"  patch1 bytes written / shard {statistics.median(written):.4f} ({min(written):.4f}-{max(written):.4f}); "
          f"bytes read / shard {statistics.median(moved):.4f} ({min(moved):.4f}-{max(moved):.4f}); "
          f"all rounds deltas: {all(p[k]['delta'] for k in p)}; staging blocks fresh from the system: {fresh}")
    hashed = ", ".join(f"{p[k].get('hashed_bytes', 0) / read:.4f}" for k in sorted(p))
    print(f"  patch1 bytes hashed / shard, per round: {hashed}")
    for key in ("publish_s", "load_s", "pause_s"):
        m, lo, hi, _ = stat("patch1", key)
        print(f"  patch1 {key:10s} {m:.4f} s ({lo:.4f}-{hi:.4f})")
    print(f"  patch1 serving: steady p99 {summary['patch_steady_p99_us']} us, during updates p99 "
          f"{summary['patch_during_p99_us']} us, longest wait {summary['patch_max_pause_us'] / 1e3:.1f} ms, "
          f"mixed responses {summary['patch_mixed_responses']:.0f}")
print(f"serving: steady p99 {summary['steady_p99_us']} us, during updates p99 {summary['during_p99_us']} us, "
      f"longest wait {summary['max_pause_us'] / 1e3:.1f} ms, mixed responses {summary['mixed_responses']:.0f}")
print(f"peak RSS: publisher {summary['publisher_peak_rss_mib']:.0f} MiB (three versions in memory: two alternated, and a delta's; patch1 adds two), "
      f"subscriber {summary['subscriber_peak_rss_mib']:.0f} MiB (the larger)")
PY
