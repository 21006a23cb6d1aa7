#!/usr/bin/env bash
# The GPU check of the CUDA backend, for a machine with an NVIDIA GPU and the CUDA toolkit:
# configures build/gpu with -DEREDU_CUDA=ON, builds only test_cuda and cuda_load, runs every
# CUDA test (the [gpu] ones included), runs the load benchmark, and prints a summary. Meant to
# finish well under 8 minutes on a 16-core machine (a few minutes of it is the build).
# usage: scripts/gpu-check.sh            (EREDU_GPU_CHECK_SIZE=4G sets the benchmark's checkpoint size)
#
# A GPU machine that cannot install packages (no network) runs binaries built elsewhere:
# scripts/gpu-bundle.sh packs them with their libraries, and then
#   EREDU_GPU_CHECK_PREBUILT=BUNDLE scripts/gpu-check.sh
# skips the install, configure and build and runs BUNDLE's test_cuda and cuda_load.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
prebuilt="${EREDU_GPU_CHECK_PREBUILT:-}"
build="${prebuilt:-build/gpu}"
log_dir="$build/gpu-check"
size="${EREDU_GPU_CHECK_SIZE:-4G}"
jobs="${EREDU_JOBS:-$(nproc)}"
stage() { echo "== $* ($(( $(date +%s) - start )) s)"; }

# What the build needs from Debian, installed only when missing (scripts/setup.sh's list,
# without the clang and fio the GPU check does not use).
packages=(cmake ninja-build g++ pkg-config liburing-dev libtbb-dev libasio-dev catch2 libfmt-dev libxxhash-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ -n "$prebuilt" ]; then
  missing=()
  export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -d "$prebuilt/data" ] && export EREDU_SHARED_DATA_DIR="$prebuilt/data"
fi
if [ ${#missing[@]} -gt 0 ]; then
  stage "installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq >/dev/null
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

gpu="none"
arch="80;90"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
  # Build only for the GPU present (compute_cap "9.0" -> 90): half the nvcc work.
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')"
  if [[ "$cap" =~ ^[0-9]+$ ]]; then arch="$cap"; fi
fi

mkdir -p "$log_dir"
build_s=0
if [ -n "$prebuilt" ]; then
  stage "prebuilt binaries in $build ($(cat "$build/BUILT" 2>/dev/null || echo 'origin unknown'))"
else
stage "configure $build (EREDU_CUDA=ON, architectures $arch)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEREDU_WERROR=ON -DEREDU_CUDA=ON \
  "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DEREDU_BUILD_EXAMPLES=OFF -DEREDU_BUILD_TOOLS=OFF >"$log_dir/configure.log" 2>&1 ||
  { cat "$log_dir/configure.log"; exit 1; }

stage "build test_cuda and cuda_load (-j $jobs)"
build_start=$(date +%s)
cmake --build "$build" -j "$jobs" --target test_cuda test_conformance_cuda cuda_load >"$log_dir/build.log" 2>&1 ||
  { tail -n 60 "$log_dir/build.log"; exit 1; }
build_s=$(( $(date +%s) - build_start ))
fi

stage "CUDA tests"
tests_rc=0
timeout -k 10 "${EREDU_GPU_TEST_TIMEOUT:-240}" "$build/tests/cuda/test_cuda" --durations yes >"$log_dir/tests.log" 2>&1 || tests_rc=$?
tail -n 4 "$log_dir/tests.log"
skipped=$(grep -c "no CUDA device" "$log_dir/tests.log" || true)
conformance_rc=0
if [ -x "$build/tests/test_conformance_cuda" ]; then
  stage "the engine's backend conformance cases on the CUDA backend"
  timeout -k 10 120 "$build/tests/test_conformance_cuda" >"$log_dir/conformance.log" 2>&1 || conformance_rc=$?
  tail -n 2 "$log_dir/conformance.log"
fi

stage "benchmark: cuda_load --size $size"
bench_rc=0
timeout -k 10 "${EREDU_GPU_BENCH_TIMEOUT:-300}" "$build/bench/cuda_load" --size "$size" --dir "$build" 2>&1 | tee "$log_dir/bench.log" || bench_rc=$?

echo
echo "== summary"
echo "date        $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "gpu         $gpu"
if [ -n "$prebuilt" ]; then
  echo "cuda        driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)"
else
  echo "cuda        $(grep -o 'CUDA backend on (CUDA [0-9.]*' "$log_dir/configure.log" | sed 's/.*CUDA //' || true)"
fi
if [ -n "$prebuilt" ]; then
  echo "build       prebuilt: $(cat "$build/BUILT" 2>/dev/null || echo 'origin unknown')"
else
  echo "build       ${build_s} s (test_cuda + cuda_load, architectures $arch, -j $jobs)"
fi
echo "tests       $(grep -E '^(All tests passed|test cases:)' "$log_dir/tests.log" | tail -n 1) (exit $tests_rc; GPU cases skipped: $skipped)"
[ -f "$log_dir/conformance.log" ] &&
  echo "conformance $(grep -E '^(All tests passed|test cases:)' "$log_dir/conformance.log" | tail -n 1) (exit $conformance_rc)"
echo "benchmark"
grep -E '^(checkpoint|host read|pcie h2d|read \+ pcie|load to device|ratio|staging|bytes|cuda_load: skipped)' "$log_dir/bench.log" | sed 's/^/  /' || true
echo "total       $(( $(date +%s) - start )) s; logs in $log_dir"
[ "$tests_rc" -eq 0 ] && [ "$conformance_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$skipped" -eq 0 ]
