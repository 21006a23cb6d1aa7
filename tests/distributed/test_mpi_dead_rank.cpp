// A rank that dies (SIGKILL on itself) where the others wait for it in a collective: the
// survivors get a typed CollectiveError within the group's timeout, naming the dead rank,
// instead of hanging. Run only by its own ctest ("[dead_rank]", with mpirun's
// --enable-recovery, which keeps the survivors alive); the ctest passes on the line printed
// below.

#include <algorithm>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>

#include "distributed/mpi_fixture.hpp"
#include "eredu/core/collective_error.hpp"
#include "eredu/cpu/executor.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/mpi/backend.hpp"

using namespace eredu;

TEST_CASE("mpi – a rank killed before a collective gives the others a typed error within the timeout",
          "[mpi][dead_rank]") {
  mpi::Communicator& world = test::mpi_world();
  REQUIRE(world.size() >= 2);
  cpu::Executor arena(2);
  mpi::Communicator group = world.split(0, world.rank(), "victim");
  group.set_timeout(std::chrono::milliseconds(3000));
  auto ready = world.async_barrier(asio::use_future);
  test::get_within(ready);
  if (world.rank() == 1) {
    test::wait_until_past(world);  // everyone left the barrier (see say_past)
    std::raise(SIGKILL);
  }
  test::say_past(world, 1);

  cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, {1024});
  const auto start = std::chrono::steady_clock::now();
  auto f = engine::async_all_reduce<mpi::Backend>(arena, group, t, engine::ReduceOp::sum, asio::use_future);
  try {
    test::get_within(f, std::chrono::seconds(30));
    FAIL("the collective completed without rank 1");
  } catch (const CollectiveError& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    CHECK(e.kind() == errc::collective_error);
    CHECK(e.operation() == "all_reduce");
    CHECK(e.group() == "victim");
    CHECK(waited < std::chrono::seconds(10));
    const bool names_rank_1 = std::find(e.ranks().begin(), e.ranks().end(), 1) != e.ranks().end();
    CHECK(names_rank_1);
    if (group.rank() == 0 && names_rank_1 && waited < std::chrono::seconds(10)) {
      std::printf("dead-rank: rank 0 got collective_error naming rank 1 after %lld ms: %s\n",
                  static_cast<long long>(waited.count()), e.what());
      std::fflush(stdout);
    }
  }
  CHECK_FALSE(group.usable());
}
