#include "eredu/io/reading/lease_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <list>
#include <new>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"

namespace eredu::io {
namespace {

// Touches every page on all cores: what the pool did at open before it populated lazily
// (LeasePoolOptions::prefault).
void prefault(std::span<std::byte> region) {
  const std::size_t threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  const std::size_t per = (region.size() / threads + 4095) / 4096 * 4096;
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    std::size_t begin = t * per;
    if (begin >= region.size()) break;
    std::size_t end = std::min(region.size(), begin + per);
    auto touch = [p = region.data(), begin, end] {
      for (std::size_t i = begin; i < end; i += 4096) p[i] = std::byte{0};
    };
    try {
      workers.emplace_back(touch);
    } catch (const std::system_error&) {
      touch();  // no thread to spare (a small ulimit -v, RLIMIT_NPROC): touch this part here
    } catch (const std::bad_alloc&) {
      touch();
    }
  }
  for (auto& w : workers) w.join();
}

}  // namespace

/// The idle timer, shared with its pending handler so that the handler can outlive the pool
/// (it then finds `pool` null). Timer operations run on `strand` only.
struct LeasePool::IdleTimer {
  IdleTimer(LeasePool* p, const asio::any_io_executor& ex) : strand(asio::make_strand(ex)), timer(strand), pool(p) {}
  asio::strand<asio::any_io_executor> strand;
  asio::steady_timer timer;
  std::mutex mutex;    // guards pool, armed and hook (taken before LeasePool::mutex_)
  LeasePool* pool;     // null once the pool is destroyed
  bool armed = false;  // a wait is pending or about to be
  ReleaseHook hook;    // set_release_hook
};

void LeasePool::KeepResident::reset() noexcept {
  if (!pool_) return;
  bool idle = false;
  {
    std::lock_guard lock(pool_->mutex_);  // noexcept in practice: a std::mutex lock fails only on misuse
    --pool_->keep_resident_;
    idle = pool_->keep_resident_ == 0 && pool_->in_use() == 0 && pool_->populated_;
    if (idle) pool_->idle_since_ = std::chrono::steady_clock::now();
  }
  LeasePool* pool = std::exchange(pool_, nullptr);
  if (!idle) return;
  try {
    pool->schedule_release();
  } catch (...) {
    // No memory for the timer's handler: the pages just stay until the next idle.
  }
}

LeasePool::KeepResident LeasePool::keep_resident() {
  std::lock_guard lock(mutex_);
  ++keep_resident_;
  return KeepResident(this);
}

bool LeasePool::populated() const {
  std::lock_guard lock(mutex_);
  return populated_;
}

std::uint64_t LeasePool::releases() const {
  std::lock_guard lock(mutex_);
  return releases_;
}

void LeasePool::set_release_hook(ReleaseHook hook) {
  std::lock_guard lock(idle_->mutex);
  idle_->hook = std::move(hook);
}

bool LeasePool::release_if_idle() {
  std::lock_guard lock(mutex_);
  if (in_use() != 0 || keep_resident_ != 0 || !populated_) return false;
  // MADV_DONTNEED frees the pages at once (MADV_FREE would leave them counted until memory
  // pressure): the point is to give the memory back. The next first touch zero-fills.
  if (::madvise(memory_.data(), memory_.size(), MADV_DONTNEED) != 0) return false;
  populated_ = false;
  ++releases_;
  return true;
}

void LeasePool::schedule_release() {
  if (release_after_.count() <= 0) return;
  std::lock_guard lock(idle_->mutex);
  if (idle_->armed || !idle_->pool) return;
  idle_->armed = true;
  asio::post(idle_->strand, [idle = idle_, after = release_after_] { wait_idle(idle, after); });
}

void LeasePool::wait_idle(const std::shared_ptr<IdleTimer>& idle, std::chrono::steady_clock::duration after) {
  idle->timer.expires_after(after);
  idle->timer.async_wait([idle](std::error_code ec) {
    std::unique_lock lock(idle->mutex);  // while held, the pool cannot be destroyed
    idle->armed = false;
    if (ec || !idle->pool) return;
    LeasePool& pool = *idle->pool;
    std::chrono::steady_clock::duration remaining{};
    {
      std::lock_guard pool_lock(pool.mutex_);
      if (pool.in_use() != 0 || pool.keep_resident_ != 0 || !pool.populated_) return;  // the next idle re-arms
      remaining = pool.idle_since_ + pool.release_after_ - std::chrono::steady_clock::now();
    }
    if (remaining > std::chrono::steady_clock::duration::zero()) {
      idle->armed = true;
      wait_idle(idle, remaining);  // this handler already runs on the strand
      return;
    }
    if (!idle->hook) {
      pool.release_if_idle();
      return;
    }
    lock.unlock();
    // The hook may call `release` inline: it takes the mutex itself, and finds the pool gone
    // if it was destroyed in between.
    idle->hook([idle] {
      std::lock_guard again(idle->mutex);
      return idle->pool != nullptr && idle->pool->release_if_idle();
    });
  });
}

void StagingBuffer::reset() noexcept {
  if (pool_) {
    std::exchange(pool_, nullptr)->release(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
}

void validate(const LeasePoolOptions& options) {
  if (options.budget < 1 || options.budget > LeasePool::max_budget) {
    throw Error(errc::invalid_argument, {},
                fmt::format("LeasePoolOptions::budget is {} bytes; the lease pool budget must be 1..{} bytes",
                            options.budget, LeasePool::max_budget));
  }
  if (options.release_after.count() < 0) {
    throw Error(errc::invalid_argument, {},
                fmt::format("LeasePoolOptions::release_after is {} ms; it must be 0 (never) or more",
                            options.release_after.count()));
  }
}

LeasePool::LeasePool(asio::any_io_executor executor, LeasePoolOptions options)
    : executor_(std::move(executor)),
      release_after_(options.release_after),
      idle_(std::make_shared<IdleTimer>(this, executor_)) {
  validate(options);
  const std::size_t size = block_size(options.budget);
  // Reserved, not populated: the pages appear as the first reads write into them.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    // ENOMEM is the address space running out (RLIMIT_AS, a full map count), not a device.
    throw Error(e == ENOMEM ? errc::out_of_memory : errc::io_error,
                {.os_error = std::error_code(e, std::system_category())},
                fmt::format("cannot map a staging pool of {} bytes", size));
  }
  memory_ = {static_cast<std::byte*>(p), size};
  try {
    free_.emplace(0, size);
  } catch (...) {
    ::munmap(p, size);
    std::rethrow_exception(typed_failure(std::current_exception()));
  }
  if (options.huge_pages) ::madvise(p, size, MADV_HUGEPAGE);  // advisory: failure is harmless
  if (options.prefault) {
    prefault(memory_);
    populated_ = true;
  }
}

LeasePool::~LeasePool() {
  {
    std::lock_guard lock(idle_->mutex);  // waits for a timer handler that is using the pool
    idle_->pool = nullptr;
  }
  try {
    asio::post(idle_->strand, [idle = idle_] { idle->timer.cancel(); });
  } catch (...) {
    // No memory for the handler: a pending wait then just finds the pool gone.
  }
  std::list<Waiter> waiters;
  {
    std::lock_guard lock(mutex_);
    waiters.swap(waiters_);
  }
  if (!waiters.empty()) {
    auto error = std::make_exception_ptr(
        Error(errc::cancelled, {}, "the lease pool was destroyed while an acquisition waited for staging memory"));
    for (auto& w : waiters) w.done(error, StagingBuffer{});
  }
  ::munmap(memory_.data(), memory_.size());
}

std::size_t LeasePool::waiting() const {
  std::lock_guard lock(mutex_);
  return waiters_.size();
}

// free_ maps offset -> length. Besides the free ranges (length > 0, coalesced) it holds one
// entry of length 0 at the offset of every block handed out: the node its release turns into
// a free range. release() runs in destructors and on any thread, where it must not allocate
// (an exception there ends the process); so the node a release needs is made here, where a
// failed allocation is the acquiring call's exception.
std::byte* LeasePool::allocate_locked(std::size_t block) {
  // First fit from the low end: recently released low blocks are reused first, so a
  // steady stream of reads keeps touching the same (cache- and TLB-warm) memory.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < block) continue;
    const std::size_t offset = it->first;
    const std::size_t rest = it->second - block;
    if (rest) free_.emplace(offset + block, rest);  // first: if it throws, nothing changed
    it->second = 0;                                 // the free range's node stays as the block's
    populated_ = true;                              // what the reader writes into it now populates its pages
    std::size_t now = in_use_.fetch_add(block, std::memory_order_relaxed) + block;
    std::size_t hw = high_water_.load(std::memory_order_relaxed);
    while (now > hw && !high_water_.compare_exchange_weak(hw, now, std::memory_order_relaxed)) {}
    return memory_.data() + offset;
  }
  return nullptr;
}

std::optional<StagingBuffer> LeasePool::try_acquire(std::size_t bytes) {
  const std::size_t block = block_size(bytes);
  std::lock_guard lock(mutex_);
  if (block > memory_.size() || !waiters_.empty()) return std::nullopt;
  if (auto* p = allocate_locked(block)) return StagingBuffer(this, p, block);
  return std::nullopt;
}

std::uint64_t LeasePool::enqueue_or_complete(std::size_t bytes, AcquireHandler done) {
  const std::size_t block = block_size(bytes);
  if (bytes > memory_.size()) {
    done(std::make_exception_ptr(
             Error(errc::exceeds_budget, {},
                   fmt::format("needs {} bytes of staging but the budget is {} bytes", bytes, memory_.size()))),
         StagingBuffer{});
    return 0;
  }
  std::unique_lock lock(mutex_);
  if (waiters_.empty()) {
    if (auto* p = allocate_locked(block)) {
      lock.unlock();
      done(nullptr, StagingBuffer(this, p, block));
      return 0;
    }
  }
  std::uint64_t id = next_waiter_id_++;
  waiters_.push_back({id, block, std::move(done)});
  return id;
}

void LeasePool::cancel_waiter(std::uint64_t id) {
  AcquireHandler done;
  {
    std::lock_guard lock(mutex_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(), [id](const Waiter& w) { return w.id == id; });
    if (it == waiters_.end()) return;  // already served
    done = std::move(it->done);
    waiters_.erase(it);
  }
  done(std::make_exception_ptr(Error(errc::cancelled, {}, "waiting for staging memory was cancelled")),
       StagingBuffer{});
  // The cancelled waiter may have been the head that blocked smaller requests behind it.
  release(nullptr, 0);
}

void LeasePool::release(std::byte* data, std::size_t size) noexcept {
  bool released = false;
  if (data) {
    std::lock_guard lock(mutex_);
    in_use_.fetch_sub(size, std::memory_order_relaxed);
    std::size_t offset = static_cast<std::size_t>(data - memory_.data());
    // The block's own entry (see allocate_locked) becomes the free range: no allocation.
    auto node = free_.find(offset);
    node->second = size;
    // Coalesce with the following and the preceding free ranges, never with the entry of
    // the block that follows (length 0, at the offset this one ends).
    auto next = std::next(node);
    if (next != free_.end() && next->first == offset + size && next->second > 0) {
      node->second += next->second;
      free_.erase(next);
    }
    if (node != free_.begin()) {
      auto prev = std::prev(node);
      if (prev->second > 0 && prev->first + prev->second == offset) {
        prev->second += node->second;
        free_.erase(node);
      }
    }
    released = true;
  }
  // Waiters are served in order, one per pass, each taken off the list by splicing (no
  // allocation) and called outside the lock: its handler may acquire or release again.
  for (;;) {
    std::list<Waiter> served;
    std::byte* p = nullptr;
    bool no_memory = false;
    {
      std::lock_guard lock(mutex_);
      if (waiters_.empty()) break;
      try {
        p = allocate_locked(waiters_.front().bytes);
      } catch (...) {
        no_memory = true;  // no node for the remainder of the free range it would split
      }
      if (!p && !no_memory) break;
      served.splice(served.end(), waiters_, waiters_.begin());
    }
    Waiter& w = served.front();
    try {
      if (p)
        w.done(nullptr, StagingBuffer(this, p, w.bytes));
      else
        w.done(out_of_memory_error(), StagingBuffer{});
    } catch (...) {
      // A handler that could not even be posted (its own allocation failed): that waiter's
      // result is lost, the other waiters are still served.
    }
  }
  bool idle = false;
  if (released) {
    std::lock_guard lock(mutex_);
    if (in_use() == 0 && keep_resident_ == 0) {
      idle_since_ = std::chrono::steady_clock::now();
      idle = true;
    }
  }
  if (idle) {
    try {
      schedule_release();
    } catch (...) {
      // No memory for the timer's handler: the pages just stay until the next idle.
    }
  }
}

}  // namespace eredu::io
