#pragma once
// Shared by the MPI tests (run under mpirun from ctest, see tests/distributed/CMakeLists.txt):
// the process's MPI environment and world communicator, made once by mpi_main.cpp before
// Catch2 runs, waiting for a future without hanging the job, and the flags by which a rank
// that kills itself learns that the others no longer need it.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

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

/// The file by which world rank `rank` tells the process `pid` that it is past a point.
inline std::filesystem::path past_flag(std::int64_t pid, int rank) {
  return std::filesystem::temp_directory_path() /
         ("eredu-test-past-" + std::to_string(pid) + "-" + std::to_string(rank));
}

/// Tells `world`'s rank `victim`, which waits in wait_until_past, that this rank is past the
/// point the victim must not die before. A barrier would race: the victim can leave it and die
/// before its last message reaches the others, whose barrier then fails on its exit.
inline void say_past(mpi::Communicator& world, int victim) {
  std::ofstream(past_flag(world.peers()[static_cast<std::size_t>(victim)].pid, world.rank())).put('1');
}

/// Waits (60 s at most) until every other rank of `world` has called say_past for this rank.
inline void wait_until_past(mpi::Communicator& world) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) continue;
    const std::filesystem::path flag = past_flag(::getpid(), r);
    while (!std::filesystem::exists(flag) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::filesystem::remove(flag);
  }
}

}  // namespace eredu::test
