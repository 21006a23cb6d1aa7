#!/usr/bin/env bash
# Installs what eredu needs from Debian's packages (only what is missing), then configures
# and builds the given CMake preset (default: release). Idempotent; quiet when all is there.
# usage: scripts/setup.sh [preset] [extra targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
shift || true

packages=(cmake ninja-build g++ clang clang-format libclang-rt-14-dev pkg-config liburing-dev libtbb-dev libasio-dev
          catch2 libfmt-dev libxxhash-dev libzstd-dev libssl-dev libcurl4-openssl-dev libcli11-dev help2man python3 fio
          python3-dev pybind11-dev libdlpack-dev python3-numpy python3-torch python3-pytest python3-pip python3-setuptools
          python3-wheel python3-venv python3-fsspec
          nginx-light python3-botocore aria2 iproute2
          libopenmpi-dev openmpi-bin libfuse3-dev fuse3 linux-perf python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq >/dev/null
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The S3 test server (s3rver, npm; tests/remote/servers/package-lock.json pins it) goes into
# build/npm-servers. Skipped quietly without npm (the S3 end-to-end tests then skip); redone only
# when the lock file changed.
if command -v npm >/dev/null 2>&1; then
  npm_dir=build/npm-servers
  if ! cmp -s tests/remote/servers/package-lock.json "$npm_dir/package-lock.json" ||
     [ ! -f "$npm_dir/node_modules/s3rver/bin/s3rver.js" ]; then
    mkdir -p "$npm_dir"
    cp tests/remote/servers/package.json tests/remote/servers/package-lock.json "$npm_dir/"
    npm ci --prefix "$npm_dir" --no-audit --no-fund --loglevel=error >/dev/null ||
      echo "setup: npm could not install s3rver (the S3 end-to-end tests will skip)"
  fi
fi

# A tree configured before keeps its generator (a developer's Ninja tree stays Ninja); a new
# one gets CMake's default, as the presets name none.
if [ ! -f "build/$preset/CMakeCache.txt" ]; then
  cmake --preset "$preset" >/dev/null
fi
jobs="${EREDU_JOBS:-$(nproc)}"
targets=()
[ $# -gt 0 ] && targets=(--target "$@")
# Progress lines (Make's "[ 42%] Building ...", Ninja's "[7/90] ...") are dropped; with
# pipefail a failed build fails this script.
cmake --build --preset "$preset" -j "$jobs" "${targets[@]}" 2>&1 |
  { grep -v -E '^(\[ *[0-9]+(%|/[0-9]+)\]|Consolidate compiler generated dependencies|Scanning dependencies)' || true; }
