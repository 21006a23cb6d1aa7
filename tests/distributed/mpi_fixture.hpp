#pragma once
// Shared by the MPI tests (run under mpirun from ctest, see tests/distributed/CMakeLists.txt):
// the process's MPI environment and world communicator, made once by mpi_main.cpp before
// Catch2 runs, and waiting for a future without hanging the job.

#include <chrono>
#include <future>
#include <stdexcept>
#include <string>

#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"

namespace eredu::test {

/// The environment mpi_main.cpp started.
mpi::Environment& mpi_environment();
/// The world communicator (timeout: 30 s, so a broken test fails instead of hanging ctest).
mpi::Communicator& mpi_world();

/// The future's value, or its failure rethrown; throws std::runtime_error after `limit` (a
/// test never waits forever, even when a collective never completes).
template <class T>
T get_within(std::future<T>& future, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  if (future.wait_for(limit) != std::future_status::ready)
    throw std::runtime_error("no completion within " + std::to_string(limit.count()) + " ms");
  return future.get();
}

}  // namespace eredu::test
