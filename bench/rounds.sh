# Sourced by the harnesses that interleave contenders round by round (first_load_ab.sh,
# cold_load.sh): each round runs every case once, in a fresh seeded shuffle (a rotation would
# give every case the same predecessor, whose freed memory the host is taking back), each
# case SETTLE (3) s after the previous one, appending {"round", "case", "seconds"...} lines.
#
# interleave NAME ROUNDS OUT EXTRA BEFORE_ROUND BEFORE_CASE CASE...
#   run_case CASE (the caller's function) prints the case's seconds; EXTRA is appended to each
#   JSON line (e.g. ',"cold":true'); BEFORE_ROUND and BEFORE_CASE are commands (":" for none).
#   SEED (1) seeds the shuffle, so a run's orders can be replayed.
interleave() {
  local name="$1" rounds="$2" out="$3" extra="$4" before_round="$5" before_case="$6"
  shift 6
  local r c s order
  for r in $(seq "$rounds"); do
    $before_round
    mapfile -t order < <(/usr/bin/python3 -c 'import random, sys; r = random.Random(sys.argv[1]); c = sys.argv[2:]
print("\n".join(r.sample(c, len(c))))' "${SEED:-1}-$r" "$@")
    for c in "${order[@]}"; do
      sleep "${SETTLE:-3}"
      $before_case
      s=$(run_case "$c")
      echo "{\"round\":$r,\"case\":\"$c\",\"seconds\":$s$extra}" >> "$out"
    done
    echo "$name: round $r/$rounds done" >&2
  done
}
