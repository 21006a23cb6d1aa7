#!/usr/bin/env bash
# Builds the `eredu` Python package as a wheel, offline: dist/eredu-<version>-cp311-cp311-linux_x86_64.whl
# for Debian's /usr/bin/python3 (python/setup.py packages python/eredu/*.py with the extension
# the project's CMake builds). Install it with pip, e.g. into a venv made with
# --system-site-packages so that it sees Debian's numpy and torch (docs/python.md, Install).
#   BUILD_DIR: reuse that configured CMake build (its eredu_python target, rebuilt if stale) and
#              its interpreter; without it, python/setup.py configures and builds build/python-package.
#   OUT_DIR:   where the wheel goes (default: dist/ of the checkout).
# Relative paths are taken from the directory this is run in. PYTHON picks the interpreter when no
# build is given (default /usr/bin/python3).
# usage: scripts/wheel.sh [BUILD_DIR [OUT_DIR]]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${2:-$root/dist}")"
python="${PYTHON:-/usr/bin/python3}"
if [ -n "${1:-}" ]; then
  build="$(realpath -m "$1")"
  [ -f "$build/CMakeCache.txt" ] || { echo "wheel: $1 is not a configured CMake build" >&2; exit 1; }
  cached="$(sed -n 's/^Python3_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")"
  [ -n "$cached" ] || { echo "wheel: $1 was configured without the Python module" >&2; exit 1; }
  python="$cached"
  export EREDU_BUILD_DIR="$build"
else
  unset EREDU_BUILD_DIR
fi
mkdir -p "$out"
# --no-build-isolation: the interpreter's own setuptools and wheel (Debian's python3-setuptools,
# python3-wheel), no index. --no-deps: the package needs nothing at build time, and its extras
# are not wanted in dist/.
PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$python" -m pip wheel --no-build-isolation --no-deps --quiet --wheel-dir "$out" "$root/python"
version="$(sed -n 's/^project(eredu VERSION \([^ ]*\).*/\1/p' "$root/CMakeLists.txt")"
tag="$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
wheels=("$out"/eredu-"$version"-"$tag"-*.whl)
[ -f "${wheels[0]}" ] || { echo "wheel: pip made no eredu-$version-$tag-*.whl in $out" >&2; exit 1; }
echo "${wheels[0]}"
