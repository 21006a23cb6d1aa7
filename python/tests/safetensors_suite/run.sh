#!/usr/bin/env bash
# Runs Hugging Face safetensors' own Python tests against eredu: a `safetensors` package that
# re-exports eredu's drop-ins (shim/) is put first on sys.path, and the tests run in a scratch
# directory (they write tmp*.safetensors into the working directory).
#
#   python/tests/safetensors_suite/run.sh [TEST_FILE_OR_NODE...]
#
# SAFETENSORS_TESTS: the checkout's bindings/python/tests (default /tmp/st/bindings/python/tests);
# EREDU_PYTHONPATH: where `import eredu` is found (default build/release/python of this tree).
# With no arguments, runs test_pt_model.py. Extra pytest options go after `--`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
tests="${SAFETENSORS_TESTS:-/tmp/st/bindings/python/tests}"
eredu_path="${EREDU_PYTHONPATH:-$root/build/release/python}"
args=()
for a in "$@"; do
  case "$a" in
    /*|-*) args+=("$a") ;;
    *) args+=("$tests/$a") ;;
  esac
done
[ ${#args[@]} -eq 0 ] && args=("$tests/test_pt_model.py")
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
PYTHONPATH="$here/shim:$eredu_path" PYTHONDONTWRITEBYTECODE=1 \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider --rootdir "$scratch" "${args[@]}"
