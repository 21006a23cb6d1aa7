#pragma once
/// \file
/// eredu::nccl::Communicator: an owned NCCL communicator (ncclComm_t) — the group of GPU ranks
/// that nccl::Backend's collectives run over — with a name for messages and a timeout for
/// every wait, made from an mpi::Communicator of the same ranks.
///
/// \code
///   mpi::Environment env(argc, argv);
///   mpi::Communicator world = mpi::Communicator::world(env);
///   const int device = local_rank % cuda::device_count();           // one device per rank
///   nccl::Communicator gpus = nccl::Communicator::create(world, device);  // named "world", same ranks
/// \endcode
///
/// How it is made: rank 0 asks NCCL for a unique id (ncclGetUniqueId), and every rank gathers
/// every rank's contribution over the MPI communicator (mpi::Communicator::all_gather_bytes,
/// within its timeout): rank 0's id, and each rank's host and PCI bus id, so that two ranks of
/// one host on the same device are refused with a message (NCCL needs a device per rank).
/// Then ncclCommInitRankConfig with a non-blocking config, polled with ncclCommGetAsyncError:
/// a rank that never joins makes the others fail with CollectiveError after the timeout, and
/// the half-made communicator is aborted (ncclCommAbort), instead of hanging in NCCL.
///
/// Collectives of one communicator must be submitted in the same order on every rank (NCCL's
/// rule, as MPI's): submit them from one thread or strand. A collective that fails or does not
/// complete within the timeout aborts the communicator (ncclCommAbort, which also ends its
/// kernels still waiting for a peer): it is unusable from then on, and its later collectives fail
/// at once with CollectiveError.

#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>

#include "eredu/mpi/communicator.hpp"

namespace eredu::nccl {

namespace detail {
struct CommState;
}

/// Settings of an NCCL communicator.
struct CommunicatorOptions {
  /// The longest creation, and each collective once queued on its stream, may take; then it
  /// fails with CollectiveError(collective_error) and the communicator is aborted. The clock of
  /// a collective starts when it is queued on the stream, so it includes the stream's earlier
  /// work still running on the device.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// An owned NCCL communicator (see file comment). Move-only. The NCCL communicator is
/// finalized and destroyed once the handle and every collective still in flight on it are gone
/// (aborted instead when it is unusable).
class Communicator {
 public:
  /// No communicator (valid() is false).
  Communicator() noexcept;
  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  /// Drops the handle; the NCCL communicator goes with the last collective in flight on it.
  ~Communicator();

  /// The ranks of `bootstrap`, as an NCCL communicator on CUDA device `device` of this process
  /// (same rank and size), named `name` (empty: bootstrap's name). Collective and blocking:
  /// every rank of `bootstrap` calls it, in the same order relative to its other collectives.
  /// Throws Error(invalid_argument) for an empty bootstrap, BackendError when `device` cannot
  /// be selected, CollectiveError when the exchange or NCCL's initialization fails or outlives
  /// the timeout, or when two ranks of one host chose the same device.
  static Communicator create(mpi::Communicator& bootstrap, int device, std::string name = {},
                             CommunicatorOptions options = {});

  /// True when this handle owns a communicator.
  bool valid() const noexcept { return state_ != nullptr; }
  /// This process's rank in the communicator (-1 when empty).
  int rank() const noexcept;
  /// Ranks in the communicator (0 when empty).
  int size() const noexcept;
  /// The CUDA device its collectives run on (-1 when empty).
  int device() const noexcept;
  /// Its name ("world", "tp").
  const std::string& name() const noexcept;
  /// The current timeout of its collectives.
  std::chrono::milliseconds timeout() const noexcept;
  /// Changes the timeout of collectives submitted from now on.
  void set_timeout(std::chrono::milliseconds timeout) noexcept;
  /// False once a collective failed or timed out on it (it was aborted).
  bool usable() const noexcept;
  /// Why it is unusable ("" while usable).
  std::string broken_reason() const;
  /// Aborts the communicator now (ncclCommAbort): its collectives in flight end, and later ones
  /// fail at once naming `reason`. For an application that gives up on a group. Idempotent.
  void abort(const std::string& reason) noexcept;
  /// The native communicator, for inspection (null when empty or aborted). Calling NCCL on it
  /// while eredu's collectives run is the caller's own race.
  ncclComm_t native() const noexcept;

  /// The shared state (for the library's backend).
  const std::shared_ptr<detail::CommState>& state() const noexcept { return state_; }

 private:
  explicit Communicator(std::shared_ptr<detail::CommState> state) noexcept : state_(std::move(state)) {}

  std::shared_ptr<detail::CommState> state_;
};

}  // namespace eredu::nccl
