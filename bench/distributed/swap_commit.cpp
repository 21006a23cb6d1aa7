// swap_commit: what a distributed swap's commit costs — the vote and the decision of
// engine::DistributedModelSlot (DistributedSwapReport::commit_s) — against its physical floor,
// one blocking MPI_Allgather of the same ballot bytes in a plain loop, measured in the same
// rounds (alternating which goes first). Run under mpirun; rank 0 prints one JSON line.
//
//   mpirun -np 2 build/release/bench/distributed/swap_commit [--rounds 9] [--swaps 50]
//
// The ranks pass a barrier before every swap, so commit_s measures the vote itself rather than
// one rank's load finishing later than another's. The model is one small tensor: the load is
// not what is measured.

#include <mpi.h>

#include <unistd.h>
#include <algorithm>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "eredu/cpu/backend.hpp"
#include "eredu/engine/description/plan_module.hpp"
#include "eredu/engine/parallel/group_vote.hpp"
#include "eredu/engine/serving/distributed_model_slot.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/mpi/backend.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"
#include "eredu/synth/safetensors_writer.hpp"

using namespace eredu;

namespace {

using Module = engine::PlanModule<cpu::Parameter>;
using Slot = engine::DistributedModelSlot<cpu::Backend, Module, mpi::Backend>;
using Clock = std::chrono::steady_clock;

/// The q-th quantile of `v` (nearest rank).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

/// Median of a round's medians, with their min and max, as JSON.
std::string summary(const std::vector<double>& all, const std::vector<double>& round_medians) {
  return fmt::format(
      R"({{"p50_us": {:.1f}, "p99_us": {:.1f}, "max_us": {:.1f}, "round_p50_min_us": {:.1f}, "round_p50_max_us": {:.1f}}})",
      quantile(all, 0.5) * 1e6, quantile(all, 0.99) * 1e6, quantile(all, 1.0) * 1e6,
      *std::min_element(round_medians.begin(), round_medians.end()) * 1e6,
      *std::max_element(round_medians.begin(), round_medians.end()) * 1e6);
}

int run(int argc, char** argv) {
  int rounds = 9, swaps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (value <= 0) throw std::invalid_argument(fmt::format("{}: '{}' is not a positive count", flag, argv[i + 1]));
    if (flag == "--rounds")
      rounds = value;
    else if (flag == "--swaps")
      swaps = value;
    else
      throw std::invalid_argument(fmt::format("unknown option '{}' (--rounds N, --swaps N)", flag));
  }
  // The baseline calls MPI on this thread while eredu's progress thread exists.
  mpi::Environment env(argc, argv, {.required = mpi::ThreadLevel::multiple, .progress = {}});
  mpi::Communicator world = mpi::Communicator::world(env);
  mpi::Communicator vote = world.split(0, world.rank(), "vote");
  MPI_Comm plain = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &plain);

  // A one-tensor checkpoint, per rank (node-local).
  const std::string path = fmt::format("/tmp/eredu-swap-commit-{}-{}.safetensors", ::getpid(), world.rank());
  std::vector<std::byte> bytes(4096, std::byte{1});
  const std::vector<synth::TensorSpec> specs = {{"w", DType::F32, {1024}}};
  const std::vector<std::span<const std::byte>> data = {bytes};
  synth::write_safetensors(path, specs, data);
  asio::io_context ctx;
  // The swap waits for its vote with nothing queued on ctx: without the guard ctx would stop.
  auto guard = asio::make_work_guard(ctx);
  auto source = io::CheckpointSource::open(ctx.get_executor(), path);
  const engine::WeightBindingPlan plan({engine::WeightBinding::tensor("w", "w", Selection::all(), 4096)});
  cpu::Executor arena(1);
  cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
  Slot slot([&] { return Module::from_plan(plan, source->catalog()); }, vote);

  std::vector<double> eredu_all, plain_all, eredu_medians, plain_medians;
  std::vector<std::byte> ballot(sizeof(engine::Ballot)), gathered(sizeof(engine::Ballot) * world.size());
  const auto eredu_round = [&] {
    std::vector<double> r;
    for (int i = 0; i < swaps; ++i) {
      auto barrier = world.async_barrier(asio::use_future);
      barrier.get();
      auto f = slot.async_swap(*source, plan, context, {}, asio::use_future);
      while (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
        ctx.run_one_for(std::chrono::milliseconds(1));
      r.push_back(f.get().commit_s);
      if (i % 8 == 7) slot.release_previous();
    }
    eredu_all.insert(eredu_all.end(), r.begin(), r.end());
    eredu_medians.push_back(quantile(r, 0.5));
  };
  const auto plain_round = [&] {
    std::vector<double> r;
    for (int i = 0; i < swaps; ++i) {
      MPI_Barrier(plain);
      const Clock::time_point t = Clock::now();
      MPI_Allgather(ballot.data(), static_cast<int>(ballot.size()), MPI_BYTE, gathered.data(),
                    static_cast<int>(ballot.size()), MPI_BYTE, plain);
      r.push_back(std::chrono::duration<double>(Clock::now() - t).count());
    }
    plain_all.insert(plain_all.end(), r.begin(), r.end());
    plain_medians.push_back(quantile(r, 0.5));
  };
  for (int round = 0; round < rounds; ++round) {
    if (round % 2) {
      plain_round();
      eredu_round();
    } else {
      eredu_round();
      plain_round();
    }
  }
  if (world.rank() == 0)
    std::printf(
        "%s\n",
        fmt::format(
            R"({{"ranks": {}, "rounds": {}, "swaps_per_round": {}, "ballot_bytes": {}, "commit": {}, "plain_allgather": {}, "p50_ratio": {:.2f}}})",
            world.size(), rounds, swaps, sizeof(engine::Ballot), summary(eredu_all, eredu_medians),
            summary(plain_all, plain_medians), quantile(eredu_all, 0.5) / quantile(plain_all, 0.5))
            .c_str());
  MPI_Comm_free(&plain);
  std::remove(path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swap_commit: %s\n", e.what());
    return 1;
  }
}
