#include "eredu/mpi/environment.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "datatypes.hpp"
#include "eredu/core/collective_error.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/log.hpp"
#include "progress.hpp"

namespace eredu::mpi {
namespace {

std::atomic<bool> alive{false};  // one Environment at a time

int native_level(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::single:
      return MPI_THREAD_SINGLE;
    case ThreadLevel::funneled:
      return MPI_THREAD_FUNNELED;
    case ThreadLevel::serialized:
      return MPI_THREAD_SERIALIZED;
    case ThreadLevel::multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

ThreadLevel from_native(int level) {
  if (level >= MPI_THREAD_MULTIPLE) return ThreadLevel::multiple;
  if (level >= MPI_THREAD_SERIALIZED) return ThreadLevel::serialized;
  if (level >= MPI_THREAD_FUNNELED) return ThreadLevel::funneled;
  return ThreadLevel::single;
}

[[noreturn]] void fail(const std::string& detail) {
  throw CollectiveError(errc::collective_error, {.operation = "init", .group = "world"}, detail);
}

/// True when every process of the world (`world`, by rank; this one `rank`) will call
/// MPI_Finalize, `mine` saying whether this one will: the minimum of every process's answer,
/// all-reduced over MPI_COMM_WORLD, which no eredu communicator uses (they are duplicates).
/// OpenMPI's MPI_Finalize can wait for good for a process that skips it; agreeing first makes
/// them all skip it instead. Waits as long as MPI_Finalize would for a process still at work,
/// but fails (false) as soon as a process of this host is seen to have exited without
/// answering (a crash, a kill).
bool every_process_finalizes(const std::shared_ptr<detail::Progress>& progress, std::vector<Peer> world, int rank,
                             bool mine) {
  auto state = std::make_shared<detail::CommState>();
  state->progress = progress;
  state->comm = MPI_COMM_WORLD;
  state->name = "MPI_COMM_WORLD";
  state->rank = rank;
  state->size = static_cast<int>(world.size());
  state->peers = std::move(world);
  auto answers = std::make_shared<std::pair<int, int>>(mine ? 1 : 0, 0);
  detail::OperationSpec spec;
  spec.operation = "finalize agreement";
  spec.what = "whether every process finalizes MPI";
  spec.timeout = std::chrono::hours(24 * 365);  // MPI_Finalize's own wait has no limit
  spec.patient = true;
  spec.watch_all = true;
  spec.keep = answers;
  spec.start = [answers = answers.get()](MPI_Comm comm, std::vector<MPI_Request>& requests) {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(&answers->first, &answers->second, 1, MPI_INT, MPI_MIN, comm, &request);
    if (rc == MPI_SUCCESS) requests.push_back(request);
    return rc;
  };
  const Completion agreed = progress->submit(state, std::move(spec));
  agreed.wait();
  return !agreed.error() && answers->second == 1;
}

}  // namespace

const char* thread_level_name(ThreadLevel level) noexcept {
  switch (level) {
    case ThreadLevel::single:
      return "MPI_THREAD_SINGLE";
    case ThreadLevel::funneled:
      return "MPI_THREAD_FUNNELED";
    case ThreadLevel::serialized:
      return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::multiple:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

Environment::Environment(int& argc, char**& argv, EnvironmentOptions options) { start(&argc, &argv, options); }

Environment::Environment(EnvironmentOptions options) { start(nullptr, nullptr, options); }

void Environment::start(int* argc, char*** argv, const EnvironmentOptions& options) {
  if (alive.exchange(true)) fail("another eredu::mpi::Environment is alive in this process; MPI has one lifetime");
  try {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) fail("MPI was already finalized in this process and cannot start again");
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      // OpenMPI's libnbc runs an in-place MPI_Iallreduce (eredu's) on fewer than 4 ranks as a
      // reduce to rank 0, then a broadcast: 0.32-0.53x the blocking call at 1-64 MiB on 2
      // ranks; its ring algorithm runs at 0.91-0.99x (docs/performance.md). Unless the user
      // chose (the environment or mpirun --mca), eredu asks for the ring; OpenMPI reads
      // OMPI_MCA_* from the environment in MPI_Init, other MPIs ignore it.
      ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
      // osc/rdma attaches at most 64 regions to a dynamic window by default, and a publisher
      // attaches one per separately allocated tensor (a 7B Llama has 291): unless the user
      // chose, allow 16384 (a table of about 1 MiB per window).
      ::setenv("OMPI_MCA_osc_rdma_max_attach", "16384", 0);
      const int rc = MPI_Init_thread(argc, argv, native_level(options.required), &provided);
      if (rc != MPI_SUCCESS) fail(fmt::format("MPI_Init_thread failed: {}", detail::mpi_error_text(rc)));
      initialized_here_ = true;
    }
    provided_ = from_native(provided);
    if (provided_ < options.required) {
      if (initialized_here_) MPI_Finalize();
      fail(fmt::format("MPI provides {} but eredu needs at least {}{}", thread_level_name(provided_),
                       thread_level_name(options.required),
                       initialized ? " (the application initialized MPI itself: ask MPI_Init_thread for it)" : ""));
    }
    // Errors are returned, never fatal, on the world communicator and every one derived from it.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    if (const int rc = detail::create_custom_types(); rc != MPI_SUCCESS)
      fail(fmt::format("creating the BF16/F16 reductions failed: {}", detail::mpi_error_text(rc)));
    progress_ = std::make_shared<detail::Progress>(options.progress);
    progress_->start();
    log::debug("MPI started: rank {} of {}, {}", world_rank_, world_size_, thread_level_name(provided_));
  } catch (...) {
    alive.store(false);
    throw;
  }
}

Environment::~Environment() {
  // Every process decides together whether to finalize (every_process_finalizes), while the
  // progress thread still runs. Without a world communicator (never made, so never noted)
  // there are no peers to watch: each process decides alone, as before.
  bool agreed = true;
  if (progress_ && initialized_here_) {
    const std::vector<Peer> world = progress_->world();
    if (world.size() > 1 && static_cast<int>(world.size()) == world_size_)
      agreed = every_process_finalizes(progress_, world, world_rank_,
                                       !progress_->has_stuck_operations() && !progress_->peer_exited());
  }
  if (progress_) progress_->stop();
  const bool stuck = progress_ && progress_->has_stuck_operations();
  if (stuck) {
    log::warn(
        "MPI is not finalized: a collective that timed out is still inside MPI, or a window was left to MPI (a "
        "peer died or stalled), and MPI_Finalize would wait for it");
  } else if (progress_ && progress_->peer_exited()) {
    log::warn(
        "MPI is not finalized: a process of this job on this host has exited without it, and MPI_Finalize "
        "would wait for it");
  } else if (!agreed) {
    log::warn(
        "MPI is not finalized: another process of this job does not finalize it (an operation of its timed out, "
        "or it saw a process exit), and MPI_Finalize would wait for it");
  } else {
    detail::free_custom_types();
    if (initialized_here_) {
      if (const int rc = MPI_Finalize(); rc != MPI_SUCCESS)
        log::warn("MPI_Finalize failed: {}", detail::mpi_error_text(rc));
    }
  }
  alive.store(false);
}

bool Environment::has_stuck_collectives() const noexcept { return progress_ && progress_->has_stuck_operations(); }

bool Environment::launched_by_mpirun() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS",
                           "SLURM_PROCID", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace eredu::mpi
