#pragma once
// The memory two-sided replies are received into (private to eredu::mpi): a fixed share of a
// subscriber's staging budget, handed out as whole buffers and waited for asynchronously when
// it is all in use, so that staging (leases plus replies) never exceeds the budget.
//
// A buffer whose receive failed or timed out stays with MPI, which may still write it: its
// receive owns it, and its bytes stay counted here for good ("lost"). Once lost bytes leave
// too little for a request, it fails at once with exceeds_budget instead of waiting for memory
// that never comes back (after a timeout the group is unusable anyway).
//
// Buffers are kept for the next replies rather than freed: a fresh buffer's pages would be
// faulted in one by one inside the single-copy receive (process_vm_readv), measured slower
// than the copy itself (docs/performance.md).

#include <cstddef>
#include <mutex>
#include <vector>

#include <asio/awaitable.hpp>

#include "eredu/core/completion.hpp"
#include "live/channel.hpp"

namespace eredu::mpi::detail {

/// Reply buffers within a byte budget (see file comment). Thread-safe.
class ReplyBuffers {
 public:
  /// At most `budget` bytes of buffers at once.
  explicit ReplyBuffers(std::size_t budget) noexcept : budget_(budget) {}
  ReplyBuffers(const ReplyBuffers&) = delete;
  ReplyBuffers& operator=(const ReplyBuffers&) = delete;

  /// A buffer of at least `size` bytes, waiting while the budget is in use. Throws
  /// Error(exceeds_budget) when `size` exceeds what the budget has left after lost buffers.
  asio::awaitable<MessageBuffer> acquire(std::size_t size);
  /// Takes `buffer` back (from acquire) for the next reply.
  void release(MessageBuffer buffer) noexcept;
  /// Records that a buffer of `capacity` bytes from acquire stays with MPI (see file comment).
  void lose(std::size_t capacity) noexcept;

  /// The budget.
  std::size_t budget() const noexcept { return budget_; }
  /// Most bytes of buffers that existed at once (handed out, kept or lost).
  std::size_t high_water() const;

 private:
  void wake_all();  // under mutex_

  const std::size_t budget_;
  mutable std::mutex mutex_;
  std::vector<MessageBuffer> kept_;  // free, for the next replies
  std::size_t held_ = 0;             // bytes of every buffer that exists: kept, handed out or lost
  std::size_t lost_ = 0;
  std::size_t high_water_ = 0;
  std::vector<CompletionSource> waiters_;
};

}  // namespace eredu::mpi::detail
