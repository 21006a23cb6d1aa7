#pragma once
// The progress thread: the one thread that calls MPI while an Environment lives (private to
// eredu::mpi). Operations are submitted from any thread with the communicator they run on; the
// thread starts each communicator's operations in submission order once the work they are
// ordered after has completed, tests every outstanding request with MPI_Testsome, completes
// each operation's eredu::Completion from this thread, and fails an operation whose wait
// outlives its timeout (keeping its buffers alive: MPI may still write them) and makes its
// communicator unusable.

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "eredu/core/collective_error.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"

namespace eredu::mpi::detail {

class Progress;

/// The state of one communicator, shared by its handle and its in-flight operations.
struct CommState {
  std::shared_ptr<Progress> progress;  ///< never null
  MPI_Comm comm = MPI_COMM_NULL;       ///< set once created; freed by a job on the progress thread
  bool freed = false;                  ///< the free job ran (progress thread only): start nothing more
  std::string name{};
  int rank = 0;
  int size = 1;
  std::vector<Peer> peers{};                     ///< by rank
  std::atomic<std::int64_t> timeout_ms{60'000};  ///< CommunicatorOptions::timeout
  // Guarded by the Progress mutex:
  bool broken = false;          ///< a collective failed or timed out: no more collectives
  std::string broken_reason{};  ///< why, for the errors of later collectives
};

/// What one submitted operation does.
struct OperationSpec {
  std::string operation{};  ///< "all_reduce", for messages
  std::string what{};       ///< what it moves ("F32 [4, 8]"), for messages
  /// Started only once this has completed (invalid: at once). A failure here does not keep
  /// the operation from running — the other ranks wait for it — but fails its completion.
  Completion after{};
  /// The wait's limit once started; zero: the communicator's.
  std::chrono::milliseconds timeout{0};
  /// Starts the MPI work on the progress thread: appends the requests it started to the vector
  /// and returns an MPI error code. A blocking job (split, dup, free) runs to its end inside.
  UniqueFunction<int(MPI_Comm, std::vector<MPI_Request>&)> start{};
  /// Runs on the progress thread once every request has completed successfully, before the
  /// completion is finished (a split records the new communicator, say); may throw.
  UniqueFunction<void()> on_success{};
  /// Runs on the progress thread with each request's status as it completes, before
  /// on_success (a receive learns how many bytes came).
  UniqueFunction<void(const MPI_Status&)> on_status{};
  /// Buffers the requests read and write: released only once MPI is done with them.
  std::shared_ptr<void> keep{};
  /// A wait that may be long (a vote): the thread sleeps between polls while only such
  /// operations are in flight.
  bool patient = false;
  /// Runs even on an unusable communicator (freeing it); never fails for that reason.
  bool cleanup = false;
  /// The ranks whose exit means it can never complete, watched while it waits (those on this
  /// host: exited_peers): every peer (a collective), or `watch_peer` (a receive from one
  /// rank). It then fails as at its timeout, but as soon as the exit is seen.
  bool watch_all = false;
  int watch_peer = -1;  ///< -1: none
};

/// The progress thread and its queues (see file comment). Shared by the Environment, every
/// communicator and every completion callback, so that a late callback never touches a
/// destroyed engine.
class Progress : public std::enable_shared_from_this<Progress> {
 public:
  /// Starts nothing: start() does.
  explicit Progress(ProgressOptions options) : options_(options) {}
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Starts the thread.
  void start();
  /// Stops the thread once every operation already started has finished or timed out;
  /// operations not yet started fail with Error(cancelled). Idempotent.
  void stop();
  /// True when an operation timed out and may still be running inside MPI (finalizing would
  /// wait for it), or something was left to MPI (leave_to_mpi).
  bool has_stuck_operations() const;
  /// Records that an MPI object was left unfreed because freeing it would wait for a rank that
  /// is gone (a live-update window): finalizing, which frees it, would wait the same way.
  void leave_to_mpi() noexcept { stuck_.fetch_add(1, std::memory_order_acq_rel); }
  /// True once a collective failed or timed out on `comm`.
  bool is_broken(const CommState& comm) const;
  /// Remembers the processes of this job's world (`peers`, this one among them), so that
  /// peer_exited() can look at them before MPI_Finalize.
  void note_world(std::vector<Peer> peers);
  /// The noted world's processes, by rank (empty: none noted).
  std::vector<Peer> world() const;
  /// True when a process of the noted world on this host has exited. Every rank of a job
  /// enters MPI_Finalize before any leaves it, so such a process died or skipped finalizing,
  /// and finalizing here would wait for it forever.
  bool peer_exited() const;

  /// Queues `spec` on `comm` and returns its completion. Never throws for MPI's reasons (a
  /// failure fails the completion); after stop() the completion fails with cancelled.
  Completion submit(const std::shared_ptr<CommState>& comm, OperationSpec spec);

 private:
  struct Operation;
  void run();
  void wake();
  void take_startable(std::vector<std::shared_ptr<Operation>>& out);
  void start_operation(const std::shared_ptr<Operation>& op, std::vector<std::shared_ptr<Operation>>& active);
  bool poll(std::vector<std::shared_ptr<Operation>>& active);
  /// Gives up on `op` as at a timeout: its requests stay with MPI (stuck), its group becomes
  /// unusable for `reason`, and its completion fails with `error`.
  void abandon(const std::shared_ptr<Operation>& op, std::string reason, std::exception_ptr error);
  void expire(std::vector<std::shared_ptr<Operation>>& active);
  void fail_exited(std::vector<std::shared_ptr<Operation>>& active);
  void finish(const std::shared_ptr<Operation>& op, std::exception_ptr error);
  std::exception_ptr broken_error(const Operation& op, const CommState& comm) const;
  std::exception_ptr timeout_error(const Operation& op) const;

  const ProgressOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Operation>> queue_;  // submitted, not yet started, in order
  std::uint64_t generation_ = 0;                  // bumped by every wake(): a wait ends
  bool started_ = false;
  bool stopping_ = false;
  std::atomic<int> stuck_{0};  // timed-out operations still inside MPI
  std::vector<Peer> world_;    // note_world(), under mutex_
  std::thread thread_;
};

/// MPI_Error_string of `rc`, with its class.
std::string mpi_error_text(int rc);

/// A CollectiveError(collective_error) for `operation` on `comm` with `detail`.
CollectiveError collective_failure(const CommState& comm, const std::string& operation, const std::string& detail,
                                   std::vector<int> ranks = {});

/// The peers of `comm` on this host, in this PID namespace, whose process has exited (the
/// dead ranks a timeout can name), by rank.
std::vector<int> exited_peers(const CommState& comm);

}  // namespace eredu::mpi::detail
