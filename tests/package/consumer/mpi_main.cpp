// The mpi component of the installed package in a consumer: MPI's environment, the world
// communicator and one all_reduce over it, checked against the sum of every rank's value. Run
// under mpirun with any number of ranks, or alone (a group of one).
#include <asio/use_future.hpp>
#include <cstdio>
#include <cstring>

#include "eredu/cpu/executor.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/mpi/backend.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"

int main(int argc, char** argv) {
  using namespace eredu;
  mpi::Environment env(argc, argv);
  int failures = 0;
  {
    mpi::Communicator world = mpi::Communicator::world(env, {.timeout = std::chrono::seconds(30)});
    cpu::Executor arena(1);
    cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, {4});
    for (int i = 0; i < 4; ++i) {
      const float v = static_cast<float>(world.rank() + 1 + i);
      std::memcpy(t.mutable_bytes().data() + i * sizeof(float), &v, sizeof v);
    }
    auto reduced = engine::async_all_reduce<mpi::Backend>(arena, world, t, engine::ReduceOp::sum, asio::use_future);
    const cpu::Tensor sum = reduced.get();
    const int n = world.size();
    for (int i = 0; i < 4; ++i) {
      float got = 0;
      std::memcpy(&got, sum.bytes().data() + i * sizeof(float), sizeof got);
      const auto want = static_cast<float>(n * (n + 1) / 2 + n * i);  // sum over ranks of (rank + 1 + i)
      if (got != want) {
        std::fprintf(stderr, "consumer_mpi: rank %d: element %d is %g, not %g\n", world.rank(), i, got, want);
        ++failures;
      }
    }
    if (failures == 0) std::printf("consumer_mpi: rank %d of %d: all_reduce ok\n", world.rank(), n);
  }
  return failures == 0 ? 0 : 1;
}
