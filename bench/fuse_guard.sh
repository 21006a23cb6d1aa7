#!/usr/bin/env bash
# What the page-cache guard's lock costs a FUSE server that answers every read in full:
# `eredu load` of one checkpoint served by faultfs with DELAY ms added to every request,
# from a directory in page-cache mode (reads guarded: io::PageCacheGuardLock) and from one
# in direct_io mode (no page cache, no guard), for two builds, interleaved in a fresh
# shuffle every round (rounds.sh). Prints per case the median (min-max) of the load's wall
# seconds, and per round the ratio of each build's guarded load to its unguarded one.
#
# usage: bench/fuse_guard.sh BEFORE_ERDU AFTER_ERDU [--rounds 7] [--size 128M] [--delay 5]
#   (the faultfs binary is taken from AFTER_ERDU's build tree: tests/faultfs/faultfs)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before="${1:?usage: fuse_guard.sh BEFORE_ERDU AFTER_ERDU [--rounds N] [--size S] [--delay MS]}"
after="${2:?usage: fuse_guard.sh BEFORE_ERDU AFTER_ERDU [--rounds N] [--size S] [--delay MS]}"
shift 2
rounds=7; size=128M; delay=5
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?}"; shift 2 ;;
    --size) size="${2:?}"; shift 2 ;;
    --delay) delay="${2:?}"; shift 2 ;;
    *) echo "fuse_guard.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
faultfs="$(cd "$(dirname "$after")/.." && pwd)/tests/faultfs/faultfs"
[ -x "$faultfs" ] || { echo "fuse_guard.sh: no faultfs at $faultfs (build the tests)" >&2; exit 2; }
[ -e /dev/fuse ] || { echo "fuse_guard.sh: no /dev/fuse: FUSE cannot be mounted here" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/eredu-fuse-guard.XXXXXX")"
mnt="$work/mnt"; src="$work/src"; out="$work/rounds.jsonl"
mkdir -p "$mnt" "$src/m" "$src/n"
fs_pid=""
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || true
  [ -n "$fs_pid" ] && wait "$fs_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$after" gen "$src/m" --size "$size" -q
cp "$src/m/model.safetensors" "$src/n/"
printf '* delay %s\n* direct_io off\n' "$delay" > "$src/m/.faultfs"
printf '* delay %s\n* direct_io on\n' "$delay" > "$src/n/.faultfs"
"$faultfs" "$src" "$mnt" -f -o max_threads=8 &
fs_pid=$!
for _ in $(seq 100); do [ -f "$mnt/m/model.safetensors" ] && break; sleep 0.1; done
[ -f "$mnt/m/model.safetensors" ] || { echo "fuse_guard.sh: faultfs did not mount" >&2; exit 1; }

run_case() {  # before-guarded | before-direct_io | after-guarded | after-direct_io
  local bin dir t0 t1
  case "$1" in before-*) bin="$before" ;; *) bin="$after" ;; esac
  case "$1" in *-guarded) dir=m ;; *) dir=n ;; esac
  t0=$(date +%s.%N)
  "$bin" load "$mnt/$dir" -q > /dev/null
  t1=$(date +%s.%N)
  /usr/bin/python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.4f}')" "$t0" "$t1"
}
# shellcheck source=bench/rounds.sh
source "$here/rounds.sh"
SETTLE="${SETTLE:-1}" interleave fuse_guard "$rounds" "$out" "" : : \
  before-guarded before-direct_io after-guarded after-direct_io

/usr/bin/python3 - "$out" "$size" "$delay" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows: by.setdefault(r["case"], {})[r["round"]] = r["seconds"]
fmt = lambda v: f"{statistics.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})"
print(f"eredu load of a {sys.argv[2]} checkpoint from faultfs, {sys.argv[3]} ms per request, {len(by['after-guarded'])} rounds")
for case in ("before-guarded", "after-guarded", "before-direct_io", "after-direct_io"):
    print(f"  {case:18} {fmt(list(by[case].values()))}")
for b in ("before", "after"):
    ratios = [by[f"{b}-guarded"][r] / by[f"{b}-direct_io"][r] for r in by[f"{b}-guarded"]]
    print(f"  {b}: guarded / direct_io per round {fmt(ratios).replace(' s', '')}")
ratios = [by["after-guarded"][r] / by["before-guarded"][r] for r in by["after-guarded"]]
print(f"  guarded, after / before per round {fmt(ratios).replace(' s', '')}")
for r in rows: print(json.dumps(r))
PY
