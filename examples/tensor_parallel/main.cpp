// tensor_parallel: a stack of MLP blocks sharded across the ranks of an MPI job (gate/up
// column-parallel, down row-parallel with one all_reduce per block), served step by step
// while engine::DistributedModelSlot swaps its version on every rank in the background; then
// a version that is corrupt on the last rank's copy only, which every rank must reject while
// serving goes on; then a rollback.
//
//   mpirun -np 2|3|4 tensor_parallel [--swaps N] [--gap STEPS]
//
// Each rank writes its own copy of three versions (A, B and C, different seeds) as sharded
// safetensors checkpoints with SHA-256 sidecars into its own temporary directory (node-local
// storage), flips four bytes of a norm in C on the last rank, and reads only its own bytes of
// each. Every step's output is compared with a single-process forward of the whole tensors of
// the version that step used, computed on each rank from the files alone. See README.md.

#include <tbb/global_control.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "../common/temp_dir.hpp"
#include "eredu/core/collective_error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/engine/serving/distributed_model_slot.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/mpi/backend.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"
#include "mlp_shard.hpp"

using namespace eredu;
using namespace eredu::example;

namespace {

using Slot = engine::DistributedModelSlot<cpu::Backend, Module, mpi::Backend>;

/// One version's checkpoint as this rank sees it: its own copy, opened.
struct VersionFiles {
  std::string label;  // recorded as the version's origin: which reference a step must match
  std::filesystem::path dir;
  std::unique_ptr<io::CheckpointSource> source;
};

/// What one step served on this rank.
struct StepRecord {
  std::uint64_t generation = 0;
  std::string origin;
  float max_diff = 0;  // against its version's reference; NaN when there is none
};

/// One swap or rollback that committed.
struct Commit {
  std::string what;
  engine::DistributedSwapReport report;
};

/// Everything the serving thread and the swap driver share.
struct Run {
  int rank = 0, size = 1;
  StackDims dims;
  Slot* slot = nullptr;
  const engine::TensorParallelPlan* plan = nullptr;
  cpu::MaterializationContext* context = nullptr;
  std::vector<VersionFiles>* versions = nullptr;  // A, B, C
  int swaps = 6;
  std::uint64_t gap = 8;  // steps served between two swaps

  std::atomic<bool> serving{false};     // the first version is in: steps may begin
  std::atomic<bool> swaps_done{false};  // this rank's driver has finished
  std::atomic<std::uint64_t> steps{0};  // steps completed on this rank
  std::vector<Commit> commits;
  std::optional<CollectiveError> rejection;
  std::uint64_t kept_generation = 0;  // what served while C was tried
  std::uint64_t reject_first_step = 0;
  std::uint64_t read_first = 0;  // bytes A's reader delivered for the first swap
  float versions_apart = 0;      // max |A's output - B's output|: what the tolerance must stay below
};

/// True on every rank when `mine` is true on every rank of `group` (one all_reduce min): the
/// ranks stop serving at the same step, since each step makes the same collectives.
bool all_ranks(cpu::Executor& arena, mpi::Communicator& group, bool mine) {
  cpu::Tensor flag = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I32, {1});
  const std::int32_t v = mine ? 1 : 0;
  std::memcpy(flag.mutable_bytes().data(), &v, sizeof v);
  auto f =
      engine::async_all_reduce<mpi::Backend>(arena, group, std::move(flag), engine::ReduceOp::min, asio::use_future);
  return f.get().as<std::int32_t>()[0] == 1;
}

/// The serving loop, on its own thread: step s takes the version that serves s on every rank,
/// runs the sharded forward (its all_reduces on `tp`), and checks the output against that
/// version's reference.
std::vector<StepRecord> serve(Run& run, mpi::Communicator& tp,
                              const std::map<std::string, std::vector<float>>& expected) {
  cpu::Executor arena(1);  // orders this loop's collectives (their fence); the compute is inline
  const std::vector<float> input = step_input(run.dims.hidden);
  const ReducePartial reduce = [&](std::vector<float>& partial) {
    cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, {partial.size()});
    std::memcpy(t.mutable_bytes().data(), partial.data(), t.nbytes());
    auto f = engine::async_all_reduce<mpi::Backend>(arena, tp, std::move(t), engine::ReduceOp::sum, asio::use_future);
    const cpu::Tensor sum = f.get();  // the group's timeout bounds the wait
    std::memcpy(partial.data(), sum.bytes().data(), sum.nbytes());
  };
  run.serving.wait(false);
  std::vector<StepRecord> records;
  for (std::uint64_t step = 0;; ++step) {
    // Taken once per step: every rank gets the same version for the same step, so the
    // partials summed by each all_reduce all come from one version.
    const std::shared_ptr<const Slot::Version> v = run.slot->version_for_step(step);
    if (!v) break;  // the first swap failed (the driver reports why)
    const std::vector<float> y = forward_shard(v->model, run.dims, input, reduce);
    StepRecord r{v->generation, v->origin, std::nanf("")};
    if (auto it = expected.find(v->origin); it != expected.end()) {
      r.max_diff = 0;
      for (std::size_t i = 0; i < y.size(); ++i) r.max_diff = std::max(r.max_diff, std::abs(y[i] - it->second[i]));
      if (!std::all_of(y.begin(), y.end(), [](float f) { return std::isfinite(f); })) r.max_diff = std::nanf("");
    }
    records.push_back(std::move(r));
    run.steps.store(step + 1, std::memory_order_release);
    if (all_ranks(arena, tp, run.swaps_done.load())) break;
  }
  return records;
}

/// Waits until this rank has served `n` more steps.
asio::awaitable<void> steps_pass(Run& run, std::uint64_t n) {
  const std::uint64_t target = run.steps.load() + n;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (run.steps.load(std::memory_order_acquire) < target) {
    timer.expires_after(std::chrono::microseconds(200));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

/// The user's code for one swap: this rank's shard of `v`, its checksums from the sidecar.
asio::awaitable<engine::DistributedSwapReport> swap_to(Run& run, VersionFiles& v) {
  engine::SwapOptions<Module> options{.origin = v.label,
                                      .checksums = io::Checksums::discover(v.dir, v.source->catalog())};
  co_return co_await run.slot->async_swap(*v.source, run.plan->bindings, *run.context, std::move(options),
                                          asio::use_awaitable);
}

/// The background side: A, then B, A, B, ... while steps are served, then C (corrupt on the
/// last rank), then a rollback. Every rank runs the same sequence (the slot's rule).
asio::awaitable<void> drive(Run& run) {
  // Each co_await is a statement of its own: g++ 12 mis-destroys temporaries of a braced
  // initializer that contains a co_await (a double free at exit).
  std::vector<VersionFiles>& v = *run.versions;
  engine::DistributedSwapReport r = co_await swap_to(run, v[0]);
  run.commits.push_back(Commit{"A", r});
  run.read_first = v[0].source->reader().stats().bytes;
  run.serving = true;
  run.serving.notify_all();
  for (int k = 1; k <= run.swaps; ++k) {
    co_await steps_pass(run, run.gap);
    VersionFiles& next = v[k % 2 == 1 ? 1 : 0];
    r = co_await swap_to(run, next);
    run.commits.push_back(Commit{next.label, r});
  }
  co_await steps_pass(run, run.gap);
  run.kept_generation = run.slot->generation();
  run.reject_first_step = run.steps.load();
  try {
    r = co_await swap_to(run, v[2]);
    run.commits.push_back(Commit{v[2].label, r});  // must not happen
  } catch (const CollectiveError& e) {
    run.rejection = e;
  }
  co_await steps_pass(run, run.gap);  // serving goes on, on the version it had
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  r = co_await run.slot->async_rollback(executor, asio::use_awaitable);
  run.commits.push_back(Commit{"rollback", r});
  co_await steps_pass(run, run.gap);
  run.swaps_done = true;
}

/// The q-quantile of `v` by nearest rank (0 when empty).
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1)];
}

/// "1.13 MiB", "2.5 KiB".
std::string mib(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  return bytes >= (1u << 20) ? fmt::format("{:.2f} MiB", b / (1 << 20)) : fmt::format("{:.1f} KiB", b / (1 << 10));
}

/// Reads "--swaps N --gap N"; returns false on a malformed command line.
bool parse(int argc, char** argv, Run& run) {
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (i + 1 >= argc) return false;
    const long value = std::stol(argv[i + 1]);
    if (name == "--swaps" && value >= 0)
      run.swaps = static_cast<int>(value);
    else if (name == "--gap" && value > 0)
      run.gap = static_cast<std::uint64_t>(value);
    else
      return false;
  }
  return true;
}

/// Checks this rank's records and outcome; rank 0 prints the summary. Returns this rank's verdict.
bool report(const Run& run, const std::vector<StepRecord>& records, float tolerance) {
  std::vector<std::string> problems;
  float worst = 0;
  std::uint64_t mismatched = 0;
  for (const StepRecord& r : records) {
    if (!(r.max_diff <= tolerance)) ++mismatched;  // NaN (no reference, or a NaN output) counts
    if (r.max_diff > worst) worst = r.max_diff;
  }
  if (mismatched)
    problems.push_back(
        fmt::format("{} of {} steps did not match their version's reference", mismatched, records.size()));
  // Each committed version serves from its activation step on, on every rank alike.
  for (const Commit& c : run.commits) {
    const std::uint64_t a = c.report.activation_step;
    if (a >= records.size() || records[a].generation != c.report.generation ||
        (a > 0 && records[a - 1].generation == c.report.generation))
      problems.push_back(fmt::format("{} (generation {}) did not start at step {}", c.what, c.report.generation, a));
  }
  const std::uint64_t rollback_step = run.commits.back().report.activation_step;
  for (std::uint64_t s = run.reject_first_step; s < rollback_step && s < records.size(); ++s)
    if (records[s].generation != run.kept_generation) {
      problems.push_back(fmt::format("step {} served generation {} while C was rejected", s, records[s].generation));
      break;
    }
  const int victim = run.size - 1;
  if (!run.rejection)
    problems.push_back("the corrupt version C was not rejected");
  else if (run.rejection->kind() != errc::rank_failed || run.rejection->ranks() != std::vector<int>{victim} ||
           run.rejection->failures().size() != 1 || run.rejection->failures()[0].kind != errc::checksum_mismatch)
    problems.push_back(fmt::format("C was rejected for another reason: {}", run.rejection->what()));
  if (run.read_first != run.plan->read_bytes)
    problems.push_back(
        fmt::format("A's first load read {} bytes, the plan says {}", run.read_first, run.plan->read_bytes));
  for (const std::string& p : problems) fmt::print(stderr, "rank {}: {}\n", run.rank, p);

  if (run.rank == 0) {
    const engine::TensorParallelPlan& plan = *run.plan;
    fmt::print("{} ranks, {} MLP blocks (hidden {}, inter {}, F32), {} per version in {} shard files + index\n",
               run.size, run.dims.layers, run.dims.hidden, run.dims.inter,
               mib(plan.split_bytes + plan.replicated_bytes), run.versions->front().source->catalog().files().size());
    fmt::print("rank 0 reads {} of each version (split {} / {} + replicated {}); A's reader delivered {}\n",
               mib(plan.read_bytes), mib(plan.split_bytes), run.size, mib(plan.replicated_bytes), mib(run.read_first));
    std::string seen;
    std::size_t switches = 0;
    for (std::size_t s = 0; s < records.size(); ++s)
      if (s == 0 || records[s].generation != records[s - 1].generation) {
        seen += fmt::format("{}{}:{}@{}", seen.empty() ? "" : " ", records[s].generation, records[s].origin, s);
        ++switches;
      }
    fmt::print("served {} steps on {} versions in turn (generation:origin@first step): {}\n", records.size(), switches,
               seen);
    fmt::print(
        "every step against its version's single-process reference: {} mismatches, max |diff| {:.3g} ({}; A and B "
        "differ by {:.3g})\n",
        mismatched, worst,
        tolerance == 0 ? "bit for bit, as 2 ranks allow" : fmt::format("tolerance {:.0e}", tolerance),
        run.versions_apart);
    std::vector<double> commit;
    for (const Commit& c : run.commits)
      if (c.what != "rollback") commit.push_back(1e3 * c.report.commit_s);
    const Commit& first = run.commits.front();
    fmt::print(
        "{} swaps committed: commit (vote + decision) p50 {:.3f} ms, p99 {:.3f} ms; load of a shard {:.1f} ms, "
        "{} of {} verified against the sidecar (the replicated norms: a slice cannot be checked against a whole "
        "tensor's digest)\n",
        commit.size(), percentile(commit, 0.5), percentile(commit, 0.99), 1e3 * first.report.load_s,
        mib(first.report.verified_bytes), mib(first.report.bytes));
    if (run.rejection) fmt::print("C rejected on every rank: {}\n", run.rejection->what());
    const engine::DistributedSwapReport& back = run.commits.back().report;
    fmt::print(
        "serving stayed on generation {} from step {}; rollback to generation {} from step {} (commit {:.3f} ms)\n",
        run.kept_generation, run.reject_first_step, back.generation, back.activation_step, 1e3 * back.commit_s);
  }
  return problems.empty();
}

/// One rank's whole run (see file comment); 0 when every rank's checks passed.
int run_example(int argc, char** argv) {
  mpi::Environment env(argc, argv);  // outlives every communicator below
  mpi::CommunicatorOptions comm_options;
  comm_options.timeout = std::chrono::seconds(30);  // a broken run fails instead of hanging
  mpi::Communicator world = mpi::Communicator::world(env, comm_options);
  // One tensor-parallel group of every rank; the slot votes on a communicator of its own, so
  // its ballots never queue behind (or ahead of) the forward's all_reduces.
  mpi::Communicator tp = world.split(0, world.rank(), "tp");
  mpi::Communicator vote = world.split(0, world.rank(), "tp-vote");

  Run run;
  run.rank = tp.rank();
  run.size = tp.size();
  if (!parse(argc, argv, run)) {
    if (run.rank == 0) fmt::print(stderr, "usage: mpirun -np N {} [--swaps 6] [--gap 8]\n", argv[0]);
    return 2;
  }
  // The serving loop's collectives and the swap's load each have an arena; none of their callers joins it, so TBB needs
  // a worker for every slot.
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, 4);

  // Node-local storage: this rank's own copy of every version (same seeds, same bytes).
  TempDir dir(fmt::format("eredu-tensor-parallel-rank{}", run.rank));
  asio::io_context ctx(1);
  io::SourceOptions source_options;
  source_options.pool.budget = 4 << 20;  // bounded staging for the background loads
  source_options.chunk_bytes = 256 << 10;
  source_options.map_resident = false;  // every byte through the reader, whose counter says what this rank read
  std::vector<VersionFiles> versions;
  for (auto [label, seed] : {std::pair{"A", 21}, std::pair{"B", 22}, std::pair{"C", 23}}) {
    VersionFiles& v = versions.emplace_back(VersionFiles{label, dir.path() / label, nullptr});
    write_checkpoint(v.dir, run.dims, static_cast<std::uint64_t>(seed), 3);
  }
  // Bit rot in the last rank's copy of C only, in a replicated tensor (every rank reads it
  // whole, so its digest can be checked); its sidecar still has the true digests.
  if (run.rank == run.size - 1) corrupt_tensor(versions[2].dir, layer_key(1, "post_attention_layernorm.weight"));
  for (VersionFiles& v : versions) v.source = io::CheckpointSource::open(ctx.get_executor(), v.dir, source_options);

  // What every step must answer, per version, from this rank's files alone.
  const std::vector<float> input = step_input(run.dims.hidden);
  std::map<std::string, std::vector<float>> expected;
  for (std::size_t i = 0; i < 2; ++i)
    expected[versions[i].label] = ReferenceStack(io::open_catalog(versions[i].dir), run.dims).forward(input, run.size);
  for (std::size_t i = 0; i < run.dims.hidden; ++i)
    run.versions_apart = std::max(run.versions_apart, std::abs(expected["A"][i] - expected["B"][i]));
  if (!(run.versions_apart > 1e-3f))
    throw std::runtime_error("A and B answer alike: the check could not tell them apart");

  // This rank's shard of every tensor: the same plan for every version (same names, shapes).
  const engine::TensorParallelPlan plan =
      engine::plan_tensor_parallel(versions[0].source->catalog(), stack_rules(), run.rank, run.size);
  cpu::Executor load_arena(1);  // the swaps' throttle: one thread, while serving runs on its own
  cpu::StoragePool storage;     // retired versions' storage is reused by the next swap
  cpu::MaterializationContext context{load_arena, storage};
  Slot slot([&plan] { return Module::from_tensor_parallel(plan); }, vote);
  run.slot = &slot;
  run.plan = &plan;
  run.context = &context;
  run.versions = &versions;

  std::vector<StepRecord> records;
  std::exception_ptr serve_error;
  std::thread server([&] {
    try {
      records = serve(run, tp, expected);
    } catch (...) {
      serve_error = std::current_exception();
    }
  });
  std::exception_ptr drive_error;
  asio::co_spawn(ctx, drive(run), [&](std::exception_ptr e) { drive_error = e; });
  try {
    ctx.run();
  } catch (...) {
    drive_error = std::current_exception();
  }
  if (drive_error) {
    // The server waits for a first version or for its peers: let it go (its collectives fail
    // by the group's timeout at worst) before reporting.
    run.swaps_done = true;
    run.serving = true;
    run.serving.notify_all();
  }
  server.join();
  if (drive_error) std::rethrow_exception(drive_error);
  if (serve_error) std::rethrow_exception(serve_error);

  // The tolerance. At 2 ranks every order of a sum of two partials gives the same bits, and
  // the reference sums the same two pieces, so every step must match bit for bit. With more
  // ranks OpenMPI chooses the reduction order ((p0 + p1) + (p2 + p3), say), which can differ
  // from the reference's left-to-right sum in the last place of each block's output, and the
  // later blocks carry that on. The outputs are rmsnorm'ed (|y| around 1): 1e-5 is about a
  // hundred ulps, far above that rounding and far below what tells two versions apart.
  const float tolerance = run.size <= 2 ? 0.0f : 1e-5f;
  const bool mine = report(run, records, tolerance);
  cpu::Executor arena(1);
  const bool ok = all_ranks(arena, world, mine);
  if (run.rank == 0) fmt::print("{}\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_example(argc, argv);
  } catch (const std::exception& e) {  // eredu's errors name the file, tensor, group and ranks
    fmt::print(stderr, "tensor_parallel: {}\n", e.what());
  }
  return 1;
}
