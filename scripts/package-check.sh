#!/usr/bin/env bash
# The installed package as a user gets it: installs a build into a fresh prefix, then
#   1. checks what the CMake package exports: no build flags (-Werror, sanitizers), no
#      internal targets (eredu_build_flags, eredu_asio), no libxxhash;
#   2. builds tests/package/consumer (an external project) with CMake, with the CUDA toolkit
#      and MPI hidden (CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit/MPI=ON), and runs it; where the
#      install has the CUDA backend, also builds it with COMPONENTS cuda; where it has MPI,
#      with COMPONENTS mpi, and runs that consumer's all_reduce under mpirun -np 2; where it has
#      NCCL, with COMPONENTS nccl (its all_reduce runs only where each rank has a GPU);
#   3. builds and runs the same program with pkg-config alone (eredu, eredu-synth; eredu-mpi
#      for the MPI consumer);
#   4. checks every public header is installed and all compile, in one unit, with -Wall -Wextra
#      -Werror and plain -I (each alone is the release suite's `package: header_check`);
#   5. checks the man page and the bash completion are installed and well-formed;
#   6. where the build has the Python module: loads a checkpoint with the package installed
#      under the prefix (PYTHONPATH=<prefix>/<EREDU_PYTHON_INSTALL_DIR>) from outside the source
#      and build trees.
# usage: scripts/package-check.sh [build dir, default build/release]   (the build must exist)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
work="$build/package-check"
prefix="$PWD/$work/prefix"
jobs="${EREDU_JOBS:-$(nproc)}"
start=$(date +%s)
step() { echo "package-check: $* ($(( $(date +%s) - start )) s)"; }
[ -f "$build/CMakeCache.txt" ] || { echo "package-check: $build is not a configured build" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
step "installing $build into $prefix"
cmake --build "$build" -j "$jobs" >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
# Everything, the Python package included, goes under the prefix; unless a user made its
# directory absolute, which would write outside it.
python_dir="$(sed -n 's/^EREDU_PYTHON_INSTALL_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")"
if [[ "$python_dir" == /* ]]; then
  echo "package-check: EREDU_PYTHON_INSTALL_DIR=$python_dir is absolute: installing would write outside $prefix" >&2
  exit 1
fi
cmake --install "$build" --prefix "$prefix" >"$work/install.log"

step "1. what the CMake package exports"
targets="$prefix/lib/cmake/eredu/eredu-targets.cmake"
for bad in eredu_build_flags eredu_asio -Werror -fsanitize; do
  if grep -q -- "$bad" "$prefix"/lib/cmake/eredu/*.cmake; then
    echo "package-check: the installed CMake package mentions '$bad':" >&2
    grep -n -- "$bad" "$prefix"/lib/cmake/eredu/*.cmake >&2
    exit 1
  fi
done
grep -q "eredu::synth" "$targets" || { echo "package-check: eredu::synth is not exported" >&2; exit 1; }

step "2. an external CMake project (CUDA toolkit and MPI hidden)"
cmake -S tests/package/consumer -B "$work/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/cmake" -j "$jobs" >>"$work/cmake.log" 2>&1 || { tail -n 40 "$work/cmake.log"; exit 1; }
"$work/cmake/consumer"
if [ -f "$prefix/lib/cmake/eredu/eredu-cuda-targets.cmake" ]; then
  step "2b. the same with find_package(eredu COMPONENTS cuda)"
  cmake -S tests/package/consumer -B "$work/cmake-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_WITH_CUDA=ON >"$work/cmake-cuda.log" 2>&1 ||
    { cat "$work/cmake-cuda.log"; exit 1; }
  cmake --build "$work/cmake-cuda" -j "$jobs" >>"$work/cmake-cuda.log" 2>&1 ||
    { tail -n 40 "$work/cmake-cuda.log"; exit 1; }
  "$work/cmake-cuda/consumer_cuda"
  # Asking for the component without the toolkit fails with a message, not a CMake error.
  if cmake -S tests/package/consumer -B "$work/cmake-nocuda" -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_WITH_CUDA=ON \
       -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON >"$work/cmake-nocuda.log" 2>&1; then
    echo "package-check: COMPONENTS cuda was found without the CUDA toolkit" >&2; exit 1
  fi
  grep -q "needs the CUDA toolkit" "$work/cmake-nocuda.log" ||
    { echo "package-check: COMPONENTS cuda without the toolkit did not say why:" >&2; cat "$work/cmake-nocuda.log"; exit 1; }
fi

# The MPI consumer under the launcher the build found (2 ranks, as CI runs the MPI tests), or
# as a group of one where the install has no launcher to offer.
mpiexec="$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")"
run_mpi() {
  if [ -n "$mpiexec" ] && [ -x "$mpiexec" ]; then
    "$mpiexec" --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2 "$@"
  else
    echo "package-check: no mpiexec in $build: running $1 as one rank"
    "$@"
  fi
}
if [ -f "$prefix/lib/cmake/eredu/eredu-mpi-targets.cmake" ]; then
  step "2c. the same with find_package(eredu COMPONENTS mpi), all_reduce under mpirun -np 2"
  cmake -S tests/package/consumer -B "$work/cmake-mpi" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_WITH_MPI=ON >"$work/cmake-mpi.log" 2>&1 ||
    { cat "$work/cmake-mpi.log"; exit 1; }
  cmake --build "$work/cmake-mpi" -j "$jobs" >>"$work/cmake-mpi.log" 2>&1 ||
    { tail -n 40 "$work/cmake-mpi.log"; exit 1; }
  run_mpi "$work/cmake-mpi/consumer_mpi"
  # Asking for the component without MPI fails with a message, not a CMake error.
  if cmake -S tests/package/consumer -B "$work/cmake-nompi" -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_WITH_MPI=ON \
       -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >"$work/cmake-nompi.log" 2>&1; then
    echo "package-check: COMPONENTS mpi was found without MPI" >&2; exit 1
  fi
  grep -q "needs MPI" "$work/cmake-nompi.log" ||
    { echo "package-check: COMPONENTS mpi without MPI did not say why:" >&2; cat "$work/cmake-nompi.log"; exit 1; }
fi

if [ -f "$prefix/lib/cmake/eredu/eredu-nccl-targets.cmake" ]; then
  step "2d. the same with find_package(eredu COMPONENTS nccl) under mpirun -np 2"
  cmake -S tests/package/consumer -B "$work/cmake-nccl" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_WITH_NCCL=ON >"$work/cmake-nccl.log" 2>&1 ||
    { cat "$work/cmake-nccl.log"; exit 1; }
  cmake --build "$work/cmake-nccl" -j "$jobs" >>"$work/cmake-nccl.log" 2>&1 ||
    { tail -n 40 "$work/cmake-nccl.log"; exit 1; }
  run_mpi "$work/cmake-nccl/consumer_nccl"
  # Without MPI the nccl component cannot be had, and says why.
  if cmake -S tests/package/consumer -B "$work/cmake-nccl-nompi" -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_WITH_NCCL=ON \
       -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >"$work/cmake-nccl-nompi.log" 2>&1; then
    echo "package-check: COMPONENTS nccl was found without MPI" >&2; exit 1
  fi
  grep -q "nccl component: it needs eredu::mpi" "$work/cmake-nccl-nompi.log" ||
    { echo "package-check: COMPONENTS nccl without MPI did not say why:" >&2; cat "$work/cmake-nccl-nompi.log"; exit 1; }
fi

step "3. the same program with pkg-config"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cxx="${CXX:-c++}"
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
"$cxx" -std=c++20 -O1 -Wall -Wextra -Werror tests/package/consumer/main.cpp -o "$work/consumer-pc" \
  $(pkg-config --cflags --libs eredu-synth eredu)
"$work/consumer-pc"
if [ -f "$prefix/lib/pkgconfig/eredu-mpi.pc" ]; then
  # shellcheck disable=SC2046  # pkg-config's output is a list of flags
  "$cxx" -std=c++20 -O1 -Wall -Wextra -Werror tests/package/consumer/mpi_main.cpp -o "$work/consumer-mpi-pc" \
    $(pkg-config --cflags --libs eredu-mpi)
  run_mpi "$work/consumer-mpi-pc"
fi

step "4. every installed header, with plain -I (-Wall -Wextra -Werror): all of them in one unit"
# Each header alone is the release suite's `package: header_check` (the same headers in the
# source tree); here what only the install can get wrong: a header left out, one that includes
# something not installed, flags pkg-config does not give. One unit compiles in seconds where
# 120 alone took 100 s of CI.
# Each component's .pc adds its dependency's include path (CUDA's, MPI's) to eredu's.
packages="eredu"
for component in cuda mpi nccl; do
  if [ -f "$prefix/lib/pkgconfig/eredu-$component.pc" ]; then packages+=" eredu-$component"; fi
done
# shellcheck disable=SC2086  # a list of package names
cflags="$(pkg-config --cflags $packages)"
(cd "$prefix/include" && find eredu -name '*.hpp' | sort) >"$work/headers.txt"
sed 's/.*/#include "&"/' "$work/headers.txt" >"$work/all_headers.cpp"
# Every public header of the packaged libraries is installed (a component's where the install
# has it).
missing_headers=""
for dir in core/include engine/include io/include backends/cpu/include app/include tools/synth/include \
           backends/cuda/include backends/mpi/include backends/nccl/include; do
  case "$dir" in
    backends/cuda/include | backends/mpi/include | backends/nccl/include)
      component="${dir#backends/}"; component="${component%/include}"
      [ -f "$prefix/lib/pkgconfig/eredu-$component.pc" ] || continue ;;
  esac
  while read -r h; do
    grep -qxF "$h" "$work/headers.txt" || missing_headers+=" $h"
  done < <(cd "$dir" && find eredu -name '*.hpp')
done
if [ -n "$missing_headers" ]; then
  echo "package-check: public headers that are not installed:$missing_headers" >&2
  exit 1
fi
# shellcheck disable=SC2086  # pkg-config's output is a list of flags
"$cxx" -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" $cflags "$work/all_headers.cpp" ||
  { echo "package-check: the installed headers do not compile together with plain -I" >&2; exit 1; }
echo "package-check: $(wc -l <"$work/headers.txt") headers installed, every public one, and compile with plain -I"

step "5. man page and bash completion"
man="$prefix/share/man/man1/eredu.1"
completion="$prefix/share/bash-completion/completions/eredu"
[ -s "$man" ] && grep -q '^\.TH EREDU' "$man" || { echo "package-check: no man page at $man" >&2; exit 1; }
[ -s "$completion" ] && bash -n "$completion" || { echo "package-check: no valid completion at $completion" >&2; exit 1; }
"$prefix/bin/eredu" --version
if [ -n "$python_dir" ] && [ -f "$build/python/eredu/__init__.py" ]; then
  step "6. the Python module, installed under the prefix"
  python="$(sed -n 's/^Python3_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")"
  site="$prefix/$python_dir"
  model="$PWD/$work/python-model"
  "$prefix/bin/eredu" gen "$model" --size 4M >"$work/python-gen.log"
  # From /: neither the checkout nor the build tree is importable, only the install.
  (cd / && PYTHONPATH="$site" PYTHONNOUSERSITE=1 "$python" - "$site" "$model" <<'PY'
import sys
import eredu
site, model = sys.argv[1], sys.argv[2]
assert eredu.__file__.startswith(site), f"eredu imported from {eredu.__file__}, not the install under {site}"
tensors = eredu.load_file(model)
with eredu.safe_open(model) as f:
    assert sorted(f.keys()) == sorted(tensors), "safe_open and load_file disagree on the tensors"
nbytes = sum(t.nbytes for t in tensors.values())
assert nbytes > 0, "the installed module loaded nothing"
print(f"package-check: installed eredu {eredu.__version__} loaded {len(tensors)} tensors, {nbytes} bytes")
PY
  )
fi
step "ok"
