#pragma once
/// \file
/// eredu::io::LeasePool: a fixed budget of page-aligned staging memory.
///
/// Every byte read from a checkpoint lands in the pool first (or, for direct reads, is
/// read by the kernel into it), so the pool's budget bounds the memory a load stages,
/// whatever the checkpoint size. Acquiring waits asynchronously while the pool is full;
/// waiters are served strictly in arrival order, so a large request is never starved by
/// a stream of small ones.
///
/// The memory is one anonymous mapping reserved at construction and populated only when
/// first used: a load that never stages (reads straight into tensors, hot or cold) never
/// touches it, so it costs neither time nor resident memory. After the pool has been idle
/// (nothing handed out) for `release_after`, its pages go back to the system
/// (MADV_DONTNEED) and the next use populates them again. Whoever registers the memory
/// with the kernel (io_uring fixed buffers, CUDA's page-locking) must either hold a
/// KeepResident token, which keeps the pages, or set a release hook that drops its
/// registration before the pages go (set_release_hook).

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/io/reading/staging_buffer.hpp"

namespace eredu::io {

/// Construction options of a LeasePool.
struct LeasePoolOptions {
  std::size_t budget = std::size_t{256} << 20;  ///< bytes of staging memory (rounded up to pages)
  bool huge_pages = true;                       ///< madvise(MADV_HUGEPAGE) on the region: cheaper first touch
  /// Touch every page at construction, on all cores (the old behaviour: costs up to 0.3 s
  /// and the whole budget in RSS at open, whether or not anything is ever staged).
  bool prefault = false;
  /// Return the pages to the system after the pool has been idle this long (0: never).
  std::chrono::milliseconds release_after{1000};
};

/// Throws eredu::Error(invalid_argument) naming `budget` when it is outside
/// 1..LeasePool::max_budget bytes, or `release_after` when it is negative.
void validate(const LeasePoolOptions& options);

/// Bounded pool of staging memory handing out StagingBuffers.
class LeasePool {
 public:
  /// Granularity and alignment of every block (O_DIRECT needs page alignment).
  static constexpr std::size_t alignment = 4096;
  /// Largest accepted budget (1 TiB): staging needs a few GiB at most, and the bound stops a
  /// typo (or a -1) before mmap or the page rounding of sizes near SIZE_MAX misbehave.
  static constexpr std::size_t max_budget = std::size_t{1} << 40;

  /// Reserves `options.budget` bytes (populated on first use). `executor` runs completions
  /// of handlers that have no associated executor, and the idle timer. Throws eredu::Error(invalid_argument) for a zero
  /// budget and eredu::Error(io_error) when the memory cannot be mapped.
  LeasePool(asio::any_io_executor executor, LeasePoolOptions options = {});
  /// Completes every waiter with eredu::Error(cancelled). Every StagingBuffer and
  /// KeepResident must have been returned.
  ~LeasePool();
  LeasePool(const LeasePool&) = delete;
  LeasePool& operator=(const LeasePool&) = delete;

  /// Fallback executor for completions.
  const asio::any_io_executor& get_executor() const noexcept { return executor_; }
  /// Total staging bytes.
  std::size_t budget() const noexcept { return memory_.size(); }
  /// Bytes currently handed out.
  std::size_t in_use() const noexcept { return in_use_.load(std::memory_order_relaxed); }
  /// Most bytes ever handed out at once since construction or reset_high_water().
  std::size_t high_water() const noexcept { return high_water_.load(std::memory_order_relaxed); }
  /// Restarts high-water tracking from the current use.
  void reset_high_water() noexcept { high_water_.store(in_use(), std::memory_order_relaxed); }
  /// Number of acquisitions currently waiting.
  std::size_t waiting() const;
  /// The pool's whole memory region (for io_uring / CUDA registration: see the file comment
  /// on keeping or releasing it).
  std::span<std::byte> memory() const noexcept { return memory_; }
  /// True when the pages may be resident: something was staged since construction or the
  /// last release (or the pool was prefaulted).
  bool populated() const;
  /// Times the pages were returned to the system so far.
  std::uint64_t releases() const;

  /// Keeps the pool's pages resident for as long as it lives (for a registration with the
  /// kernel that cannot be dropped on request, such as CUDA page-locking). Move-only; the
  /// pool must outlive it.
  class KeepResident {
   public:
    KeepResident(KeepResident&& other) noexcept : pool_(std::exchange(other.pool_, nullptr)) {}
    KeepResident& operator=(KeepResident&& other) noexcept {
      if (this != &other) {
        reset();
        pool_ = std::exchange(other.pool_, nullptr);
      }
      return *this;
    }
    KeepResident(const KeepResident&) = delete;
    KeepResident& operator=(const KeepResident&) = delete;
    ~KeepResident() { reset(); }

   private:
    friend class LeasePool;
    void reset() noexcept;
    explicit KeepResident(LeasePool* pool) noexcept : pool_(pool) {}
    LeasePool* pool_;
  };
  /// A token that keeps the pages resident while it lives.
  KeepResident keep_resident();

  /// Called, on a strand of the pool's executor, when the pool has been idle for
  /// release_after: `hook(release)` must drop whatever kernel registration points into the
  /// memory and then call `release()` (any thread), which returns the pages if the pool is
  /// still idle and reports whether it did. Not calling it keeps the pages. Set once, before
  /// the pool is used; the hook must stay callable until the pool is destroyed.
  using ReleaseHook = UniqueFunction<void(UniqueFunction<bool()> release)>;
  /// Sets the release hook (see ReleaseHook).
  void set_release_hook(ReleaseHook hook);
  /// Returns the pages to the system now if nothing is handed out and nothing keeps them
  /// (KeepResident); returns whether it did. The caller is responsible for registrations
  /// (see the file comment).
  bool release_if_idle();

  /// Bytes a request of `bytes` occupies (rounded up to whole pages, at least one page).
  static std::size_t block_size(std::size_t bytes) noexcept {
    std::size_t b = bytes ? bytes : 1;
    return (b + alignment - 1) / alignment * alignment;
  }

  /// A block of at least `bytes` now, or nullopt when it must wait (or never fits).
  std::optional<StagingBuffer> try_acquire(std::size_t bytes);

  /// Acquires a block of at least `bytes`, waiting while the pool is full.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, StagingBuffer)`. Errors (an eredu::Error): exceeds_budget at
  /// once when `bytes` exceeds the budget; cancelled when the wait is cancelled or the pool is
  /// destroyed first. The handler runs on its associated executor (get_executor() if it has
  /// none), never inline.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: a cancelled wait completes with errc::cancelled and has no
  /// other effect (nothing was acquired; the waiters behind it move up).
  ///
  /// The pool must outlive the operation and the buffer.
  template <asio::completion_token_for<void(std::exception_ptr, StagingBuffer)> Token>
  auto async_acquire(std::size_t bytes, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, StagingBuffer)>(
        [](auto handler, LeasePool* self, std::size_t n) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          auto done = eredu::detail::deliver_on_handler_executor<std::exception_ptr, StagingBuffer>(std::move(handler),
                                                                                                    self->executor_);
          self->start_acquire(n, std::move(done), slot);
        },
        token, this, bytes);
  }

 private:
  friend class StagingBuffer;
  using AcquireHandler = UniqueFunction<void(std::exception_ptr, StagingBuffer)>;
  struct Waiter {
    std::uint64_t id;
    std::size_t bytes;
    AcquireHandler done;
  };

  template <class Slot>
  void start_acquire(std::size_t bytes, AcquireHandler done, Slot& slot) {
    std::uint64_t id = enqueue_or_complete(bytes, std::move(done));
    if (id != 0 && slot.is_connected()) {
      slot.assign([this, id](asio::cancellation_type type) {
        if (type != asio::cancellation_type::none) cancel_waiter(id);
      });
    }
  }
  // Completes at once (returns 0) or queues the waiter (returns its id).
  std::uint64_t enqueue_or_complete(std::size_t bytes, AcquireHandler done);
  void cancel_waiter(std::uint64_t id);
  std::byte* allocate_locked(std::size_t block);
  void release(std::byte* data, std::size_t size) noexcept;

  struct IdleTimer;
  // Arms the idle timer after the pool became idle (called without mutex_ held).
  void schedule_release();
  // Waits `after`, then releases, waits longer, or stands down (on the timer's strand).
  static void wait_idle(const std::shared_ptr<IdleTimer>& idle, std::chrono::steady_clock::duration after);

  asio::any_io_executor executor_;
  std::span<std::byte> memory_;
  std::chrono::milliseconds release_after_;
  std::shared_ptr<IdleTimer> idle_;  // shared with its pending handler
  mutable std::mutex mutex_;
  bool populated_ = false;                            // guarded by mutex_
  std::uint64_t releases_ = 0;                        // guarded by mutex_
  std::size_t keep_resident_ = 0;                     // guarded by mutex_
  std::chrono::steady_clock::time_point idle_since_;  // guarded by mutex_
  std::map<std::size_t, std::size_t> free_;           // offset -> length, coalesced
  std::list<Waiter> waiters_;                         // FIFO
  std::uint64_t next_waiter_id_ = 1;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> high_water_{0};
};

}  // namespace eredu::io
