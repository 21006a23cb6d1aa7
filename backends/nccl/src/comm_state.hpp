#pragma once
// The state of one NCCL communicator (private to eredu::nccl), shared by its handle and by every
// collective in flight on it, so that the ncclComm_t lives until the last of them is done.

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "eredu/core/collective_error.hpp"

namespace eredu::nccl::detail {

/// One communicator (see file comment).
struct CommState {
  CommState() = default;
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;
  /// Finalizes and destroys the communicator (within the timeout, else aborts it); nothing
  /// when it was aborted. Errors are logged, not thrown.
  ~CommState();

  /// Serializes NCCL calls on `comm` (NCCL forbids concurrent calls on one communicator) and
  /// guards `comm`, `broken` and `broken_reason`.
  mutable std::mutex mutex;
  ncclComm_t comm = nullptr;  ///< null once aborted
  std::string name{};
  int rank = 0;
  int size = 1;
  int device = -1;
  std::atomic<std::int64_t> timeout_ms{60'000};  ///< CommunicatorOptions::timeout
  bool broken = false;                           ///< a collective failed or timed out: aborted
  std::string broken_reason{};                   ///< why, for the errors of later collectives
};

/// Aborts `state`'s communicator (ncclCommAbort, on its device) and marks it unusable because
/// of `reason`; the caller holds `state.mutex`. Idempotent; never throws.
void abort_locked(CommState& state, const std::string& reason) noexcept;

/// Polls ncclCommGetAsyncError on `comm` until its state is no longer ncclInProgress or
/// `deadline` passes (then ncclInProgress). Sleeps between polls, from 10 µs doubling to 1 ms.
ncclResult_t wait_ready(ncclComm_t comm, std::chrono::steady_clock::time_point deadline) noexcept;

/// A CollectiveError(collective_error) for `operation` on a group with `detail`.
CollectiveError collective_failure(const std::string& group, int rank, int size, const std::string& operation,
                                   const std::string& detail, std::vector<int> ranks = {});

/// Every rank of a group of `size` but `rank` (the ranks a timed-out collective waited for).
std::vector<int> other_ranks(int rank, int size);

}  // namespace eredu::nccl::detail
