#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs (test_cuda, test_conformance_cuda, cuda_load, eredu) with the shared libraries they
# need beyond the C and C++ runtimes, and the GGUF fixture the GPU tests compare against, for a
# GPU machine that cannot install packages. Build here (the toolkit needs no GPU), then there:
#   EREDU_GPU_CHECK_PREBUILT=BUNDLE scripts/gpu-check.sh
# The target must have a glibc and libstdc++ at least as new as this machine's.
# usage: scripts/gpu-bundle.sh [BUILD_DIR (build/release)] [BUNDLE (.gpu)]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
bundle="${2:-.gpu}"
cmake --build "$build" -j "${EREDU_JOBS:-$(nproc)}" --target test_cuda test_conformance_cuda cuda_load eredu_cli >/dev/null
[ -x "$build/tests/cuda/test_cuda" ] || { echo "gpu-bundle: $build has no CUDA backend (configure with -DEREDU_CUDA=ON)" >&2; exit 1; }
rm -rf "$bundle"
mkdir -p "$bundle/tests/cuda" "$bundle/bench" "$bundle/lib" "$bundle/data" "$bundle/tools"
cp "$build/tests/cuda/test_cuda" "$bundle/tests/cuda/"
cp "$build/tests/test_conformance_cuda" "$bundle/tests/"
cp "$build/bench/cuda_load" "$bundle/bench/"
cp "$build/tools/eredu" "$bundle/tools/"  # writes and reads the benchmark's checkpoints
# The C and C++ runtimes and the loader stay behind: the target's own are newer or equal.
ldd "$bundle"/tests/cuda/test_cuda "$bundle"/tests/test_conformance_cuda "$bundle"/bench/cuda_load "$bundle"/tools/eredu | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so' |
  while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
if [ -d ../shared/data/gguf-quant ]; then cp -r ../shared/data/gguf-quant "$bundle/data/"; fi
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes') built on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1 | awk '{print "glibc " $NF}')" >"$bundle/BUILT"
echo "gpu-bundle: $(du -sh "$bundle" | cut -f1) in $bundle ($(ls "$bundle/lib" | tr '\n' ' '))"
