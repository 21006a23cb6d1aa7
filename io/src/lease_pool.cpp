#include "eredu/io/lease_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::io {
namespace {

// First touch of fresh memory is the slow part of a load on a VM (the host hands the
// pages over lazily); doing it once, on every core, keeps it out of the reads.
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
      touch();  // no thread to spare (a small ulimit -v): touch this part here
    }
  }
  for (auto& w : workers) w.join();
}

}  // namespace

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
}

LeasePool::LeasePool(asio::any_io_executor executor, LeasePoolOptions options) : executor_(std::move(executor)) {
  validate(options);
  const std::size_t size = block_size(options.budget);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw Error(errc::io_error, {.os_error = std::error_code(errno, std::system_category())},
                fmt::format("cannot map a staging pool of {} bytes", size));
  }
  memory_ = {static_cast<std::byte*>(p), size};
  if (options.huge_pages) ::madvise(p, size, MADV_HUGEPAGE);  // advisory: failure is harmless
  if (options.prefault) prefault(memory_);
  free_.emplace(0, size);
}

LeasePool::~LeasePool() {
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

std::byte* LeasePool::allocate_locked(std::size_t block) {
  // First fit from the low end: recently released low blocks are reused first, so a
  // steady stream of reads keeps touching the same (cache- and TLB-warm) memory.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < block) continue;
    std::size_t offset = it->first;
    std::size_t rest = it->second - block;
    free_.erase(it);
    if (rest) free_.emplace(offset + block, rest);
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
  std::vector<std::pair<AcquireHandler, StagingBuffer>> ready;
  {
    std::lock_guard lock(mutex_);
    if (data) {
      in_use_.fetch_sub(size, std::memory_order_relaxed);
      std::size_t offset = static_cast<std::size_t>(data - memory_.data());
      auto next = free_.lower_bound(offset);
      // Coalesce with the following and the preceding free ranges.
      if (next != free_.end() && next->first == offset + size) {
        size += next->second;
        next = free_.erase(next);
      }
      if (next != free_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          offset = prev->first;
          size += prev->second;
          free_.erase(prev);
        }
      }
      free_.emplace(offset, size);
    }
    while (!waiters_.empty()) {
      auto* p = allocate_locked(waiters_.front().bytes);
      if (!p) break;
      ready.emplace_back(std::move(waiters_.front().done), StagingBuffer(this, p, waiters_.front().bytes));
      waiters_.pop_front();
    }
  }
  for (auto& [done, buffer] : ready) done(nullptr, std::move(buffer));
}

}  // namespace eredu::io
