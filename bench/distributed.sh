#!/usr/bin/env bash
# Distributed benchmarks (docs/performance.md, "Distributed: tensor-parallel loads and
# collectives"):
#
# (a) one Llama-shaped checkpoint (`eredu gen DIR --size SIZE`, 2G by default) loaded by one
#     process and by NP (2) ranks with `mpirun -np NP eredu load --tensor-parallel`, rounds
#     interleaved, each round in a fresh seeded shuffle, each case starting SETTLE (2) s after
#     the previous one exited:
#       single         `eredu load DIR` (resident tensors copied by the arena from a mapping)
#       single-reader  `eredu load DIR --copies reader` (every byte through the reader, as the
#                      tensor-parallel ranks read: the like-for-like baseline)
#       tp             `mpirun -np NP eredu load DIR --tensor-parallel`
#     CASES="tp-read tp-gather" instead compares the two ways of reading replicated tensors,
#     with the embedding replicated (REPLICATE, default model.embed_tokens.weight, as a
#     --shard PATTERN=replicated rule) so that the replicated bytes are large:
#       tp-read        `... --tensor-parallel --replicated read` (every rank reads them whole)
#       tp-gather      `... --tensor-parallel --replicated gather` (each rank reads 1/NP of
#                      them, the ranks all-gather: the replicated bytes read once in total)
#     Per case: the load's seconds (from the document: the slowest rank's for tp), its GB/s,
#     and the wall time of the whole command (process start, MPI start-up and exit included);
#     for tp every rank's bytes read against its target split/NP + replicated (gather:
#     split/NP + gathered/NP + replicated read whole) and the bytes it gathered.
# (b) `mpirun -np NP collectives_bench ROUNDS`: eredu's all_reduce / all_gather (and
#     all_gather_into a recycled output) against MPI_Allreduce / MPI_Allgather loops at 1, 4,
#     16 and 64 MiB; its table is printed as is (the per-round lines are dropped).
#
# usage: bench/distributed.sh EREDU COLLECTIVES_BENCH [DIR] [rounds=7] [out.jsonl]
#   DIR           where the checkpoint is written (default /tmp/eredu-distributed), kept for reuse
#   NP, SIZE, SETTLE, SEED   ranks (2), checkpoint size (2G), seconds between cases (2), shuffle seed (1)
#   MPIRUN_FLAGS  mpirun's flags (default: root, oversubscribe, yield when idle, as the ctests)
#   SKIP_COLLECTIVES=1  only (a)
#   CASES         the cases of (a) (default "single single-reader tp"), in a fresh shuffle each
#                 round, or with ORDER=rotate rotated by one each round (round r starts with case r)
# Hold /tmp/eredu-build.lock around it on a shared machine so that no build runs meanwhile:
#   flock /tmp/eredu-build.lock bench/distributed.sh build/release/tools/eredu build/release/bench/collectives_bench
set -euo pipefail
eredu="$1"; coll="$2"; dir="${3:-/tmp/eredu-distributed}"; rounds="${4:-7}"; out="${5:-$(mktemp --suffix=.jsonl)}"
np="${NP:-2}"; size="${SIZE:-2G}"
read -r -a mpirun <<< "mpirun ${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1} -np $np"
py=/usr/bin/python3
: > "$out"
if [ ! -f "$dir/model.safetensors" ]; then
  "$eredu" gen "$dir" --size "$size" -q
fi
echo "distributed: $(du -h "$dir/model.safetensors" | cut -f1) checkpoint $dir, $np ranks, $rounds rounds, rows in $out" >&2

# One case: prints a JSON row (seconds, gb_per_s, wall_seconds; for tp the ranks' figures).
run_case() {
  local t0 t1 doc
  t0=$(date +%s.%N)
  case "$1" in
    single) doc=$("$eredu" load "$dir" --json -q) ;;
    single-reader) doc=$("$eredu" load "$dir" --copies reader --json -q) ;;
    tp) doc=$("${mpirun[@]}" "$eredu" load "$dir" --tensor-parallel --json -q) ;;
    tp-read | tp-gather)
      doc=$("${mpirun[@]}" "$eredu" load "$dir" --tensor-parallel --replicated "${1#tp-}" \
        --shard "${REPLICATE:-model.embed_tokens.weight}=replicated" --json -q) ;;
  esac
  t1=$(date +%s.%N)
  "$py" -c '
import json, sys
d = json.loads(sys.argv[1]); wall = float(sys.argv[3]) - float(sys.argv[2])
row = {"seconds": d["loads"][0]["seconds"], "gb_per_s": d["loads"][0]["gb_per_s"], "wall_seconds": wall,
       "bytes": d["loads"][0].get("bytes", d["bytes"]), "peak_rss_bytes": d["peak_rss_bytes"]}
tp = d.get("tensor_parallel")
if tp:
    n, gathered = tp["rank_count"], tp.get("gathered_bytes", 0)
    row["target_bytes"] = tp["split_bytes"] // n + tp["replicated_bytes"] - gathered + gathered // n
    row["split_bytes"], row["replicated_bytes"], row["gathered_bytes"] = tp["split_bytes"], tp["replicated_bytes"], gathered
    row["ranks"] = [{k: r.get(k, 0) for k in ("rank", "read_bytes", "planned_read_bytes", "gathered_bytes", "seconds",
                                                "gb_per_s", "peak_rss_bytes", "threads")} for r in tp["ranks"]]
    for k, r in zip(row["ranks"], tp["ranks"]):
        k["gather_seconds"] = r["loads"][0].get("gather_seconds", 0)
print(json.dumps(row))' "$doc" "$t0" "$t1"
}

read -r -a cases <<< "${CASES:-single single-reader tp}"
for r in $(seq "$rounds"); do
  cat "$dir"/model.safetensors > /dev/null  # every round from the page cache
  if [ "${ORDER:-shuffle}" = rotate ]; then  # round r starts with case r - 1 (mod the cases)
    order=("${cases[@]:$(((r - 1) % ${#cases[@]}))}" "${cases[@]:0:$(((r - 1) % ${#cases[@]}))}")
  else
    mapfile -t order < <("$py" -c 'import random, sys; r = random.Random(sys.argv[1]); c = sys.argv[2:]
print("\n".join(r.sample(c, len(c))))' "${SEED:-1}-$r" "${cases[@]}")
  fi
  for c in "${order[@]}"; do
    sleep "${SETTLE:-2}"
    row=$(run_case "$c")
    echo "{\"round\":$r,\"case\":\"$c\",${row:1}" >> "$out"
  done
  echo "distributed: round $r/$rounds done (${order[*]})" >&2
done

"$py" - "$out" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
def mm(v, f="{:.3f}"): return f"{f.format(st.median(v))} ({f.format(min(v))}-{f.format(max(v))})"
print("(a) loads, median (min-max) over rounds")
print(f"{'case':<14} {'load s':<22} {'GB/s':<22} {'wall s (whole command)':<24} peak RSS MiB (largest rank)")
for c in ("single", "single-reader", "tp", "tp-read", "tp-gather"):
    v = [r for r in rows if r["case"] == c]
    if not v: continue
    print(f"{c:<14} {mm([r['seconds'] for r in v]):<22} {mm([r['gb_per_s'] for r in v], '{:.2f}'):<22} "
          f"{mm([r['wall_seconds'] for r in v]):<24} {mm([r['peak_rss_bytes'] / 2**20 for r in v], '{:.0f}')}")
for case in ("tp", "tp-read", "tp-gather"):
    tp = [r for r in rows if r["case"] == case]
    if not tp: continue
    t = tp[0]
    exact = all(k["read_bytes"] == r["target_bytes"] == k["planned_read_bytes"] for r in tp for k in r["ranks"])
    print(f"{case}: split {t['split_bytes']} B, replicated {t['replicated_bytes']} B (gathered {t['gathered_bytes']} B); "
          f"target per rank {t['target_bytes']} B; every rank of every round read exactly that: {exact}")
    for k in range(len(t["ranks"])):
        ks = [r["ranks"][k] for r in tp]
        print(f"  rank {k}: read {mm([x['read_bytes'] for x in ks], '{:.0f}')} B, gathered "
              f"{mm([x['gathered_bytes'] for x in ks], '{:.0f}')} B, {ks[0]['threads']} thread(s), load "
              f"{mm([x['seconds'] for x in ks])} s (of which the gather, waiting for the slowest rank included, "
              f"{mm([x['gather_seconds'] for x in ks])} s), {mm([x['gb_per_s'] for x in ks], '{:.2f}')} GB/s")
def same_round(a_case, b_case, key):  # b / a per round
    return [b[key] / a[key] for a in rows if a["case"] == a_case for b in rows
            if b["case"] == b_case and b["round"] == a["round"]]
for base in ("single", "single-reader"):
    if same_round("tp", base, "seconds"):
        print(f"  {base} / tp, same round: load {mm(same_round('tp', base, 'seconds'), '{:.2f}')}x, "
              f"wall {mm(same_round('tp', base, 'wall_seconds'), '{:.2f}')}x")
if same_round("tp-gather", "tp-read", "seconds"):
    print(f"  tp-read / tp-gather, same round: load {mm(same_round('tp-gather', 'tp-read', 'seconds'), '{:.2f}')}x, "
          f"wall {mm(same_round('tp-gather', 'tp-read', 'wall_seconds'), '{:.2f}')}x")
PY

if [ -z "${SKIP_COLLECTIVES:-}" ]; then
  echo "(b) collectives" && "${mpirun[@]}" "$coll" "$rounds" 1 4 16 64 | grep -v ' round '
fi
