#pragma once
// Shared by the NCCL tests (run under mpirun from ctest, see tests/nccl/CMakeLists.txt): the
// world communicator nccl_main.cpp made before Catch2 runs.

#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"

namespace eredu::test {

/// The world communicator (timeout: 30 s, so a broken test fails instead of hanging ctest).
mpi::Communicator& mpi_world();

}  // namespace eredu::test
