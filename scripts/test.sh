#!/usr/bin/env bash
# The test command: installs what is missing, builds (release preset, warnings are errors)
# and runs the whole test suite with ctest. Extra arguments go to ctest.
# usage: scripts/test.sh [preset] [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="release"
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then preset="$1"; shift; fi
bash scripts/setup.sh "$preset"
ctest --preset "$preset" -j "${EREDU_JOBS:-$(nproc)}" "$@"
