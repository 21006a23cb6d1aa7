#!/usr/bin/env bash
# Cold first loads: the page cache dropped before every case (as root: sync, then echo 3 into
# /proc/sys/vm/drop_caches), each round's cases in a fresh shuffled order, SETTLE (3) s apart:
#   copy    `eredu load PATH --json` (loads[0].seconds): copied into fresh tensor storage (a
#           tensor inside a page read O_DIRECT with its page window: --cold-reads window)
#   buffered the same with `--cold-reads buffered`: such tensors read through the page cache
#   map     `eredu load PATH --weights map --json`: the file's pages mapped, read in by the load
#   blocks  2 threads read() 2 MiB blocks into one fresh malloc buffer (load_baseline blocks)
#   fio     fio, io_uring, O_DIRECT, 4 MiB requests, depth 4: the disk's bandwidth
# Prints per case the median and min-max of seconds, and per round each eredu case's speed
# against fio and blocks (medians of the within-round ratios); writes JSON lines.
#
# usage: bench/cold_load.sh EREDU LOAD_BASELINE FILE [rounds=7] [out.jsonl]
#   EXTRA_ARGS  more `eredu load` arguments for the eredu cases; CASES the cases to run (all
#   five); SETTLE, SEED as first_load_ab.sh
set -euo pipefail
eredu="$1"; base="$2"; file="$3"; rounds="${4:-7}"; out="${5:-$(mktemp --suffix=.jsonl)}"
[ -w /proc/sys/vm/drop_caches ] || { echo "cold_load: needs root (/proc/sys/vm/drop_caches)" >&2; exit 2; }
command -v fio >/dev/null || { echo "cold_load: needs fio (apt-get install fio)" >&2; exit 2; }
: > "$out"
bytes=$(stat -c %s "$file")
read -r -a cases <<< "${CASES:-copy buffered map blocks fio}"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
seconds_of() { /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["loads"][0]["seconds"])'; }
run_case() {
  case "$1" in
    copy) "$eredu" load "$file" ${EXTRA_ARGS:-} --json -q | seconds_of ;;
    buffered) "$eredu" load "$file" ${EXTRA_ARGS:-} --cold-reads buffered --json -q | seconds_of ;;
    map) "$eredu" load "$file" ${EXTRA_ARGS:-} --weights map --json -q | seconds_of ;;
    blocks) "$base" blocks "$file" --threads 2 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])' ;;
    fio) fio --name=cold --filename="$file" --ioengine=io_uring --direct=1 --rw=read --bs=4M --iodepth=4 \
           --output-format=json 2>/dev/null |
         /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin)["jobs"][0]["read"]; print(r["io_bytes"]/r["bw_bytes"])' ;;
  esac
}
source "$(dirname "$0")/rounds.sh"
interleave cold_load "$rounds" "$out" ',"cold":true' : drop "${cases[@]}"
/usr/bin/python3 - "$out" "$bytes" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
gb = int(sys.argv[2]) / 1e9
by = {}
for r in rows: by.setdefault(r["case"], {})[r["round"]] = r["seconds"]
def mm(v): return f"{st.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})"
for c, v in by.items():
    print(f"{c:<7} {mm(list(v.values()))}  {gb / st.median(v.values()):.2f} GB/s")
def ratio(a, b):
    v = [by[b][r] / by[a][r] for r in by[a] if r in by.get(b, {})]
    return f"median {st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "n/a"
for e in ("copy", "buffered", "map"):
    if e not in by: continue
    print(f"{e} speed / fio speed      {ratio(e, 'fio')}")
    print(f"{e} speed / blocks speed   {ratio(e, 'blocks')}")
if "copy" in by and "buffered" in by:
    print(f"copy speed / buffered speed   {ratio('copy', 'buffered')}")
print(f"rows: {sys.argv[1]}")
PY
