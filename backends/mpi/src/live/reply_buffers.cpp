#include "live/reply_buffers.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <asio/use_awaitable.hpp>

#include "eredu/core/error.hpp"

namespace eredu::mpi::detail {

asio::awaitable<MessageBuffer> ReplyBuffers::acquire(std::size_t size) {
  for (;;) {
    Completion freed;
    std::size_t fresh = 0;
    {
      std::lock_guard lock(mutex_);
      if (size > budget_ - lost_)
        throw Error(errc::exceeds_budget, {},
                    fmt::format("a reply of {} bytes does not fit the {} bytes of reply memory left ({} of the "
                                "budget's {} stay with MPI after failed receives)",
                                size, budget_ - lost_, lost_, budget_));
      // The smallest kept buffer that fits.
      auto best = kept_.end();
      for (auto it = kept_.begin(); it != kept_.end(); ++it)
        if (it->capacity() >= size && (best == kept_.end() || it->capacity() < best->capacity())) best = it;
      if (best != kept_.end()) {
        MessageBuffer b = std::move(*best);
        kept_.erase(best);
        co_return b;
      }
      // Room for a new one, once kept buffers too small for it are let go.
      while (held_ + size > budget_ && !kept_.empty()) {
        held_ -= kept_.back().capacity();
        kept_.pop_back();
      }
      if (held_ + size <= budget_) {
        held_ += size;
        high_water_ = std::max(high_water_, held_);
        fresh = size;
      } else {
        CompletionSource waiter;
        freed = waiter.completion();
        waiters_.push_back(std::move(waiter));
      }
    }
    if (fresh > 0) {
      try {
        MessageBuffer b(fresh);
        std::memset(b.data(), 0, fresh);  // faulted in here, not inside the receive
        co_return b;
      } catch (...) {
        std::lock_guard lock(mutex_);
        held_ -= fresh;
        wake_all();
        throw;
      }
    }
    // Fails only when the waiter is dropped, which this class never does.
    co_await freed.async_wait(asio::use_awaitable);
  }
}

void ReplyBuffers::release(MessageBuffer buffer) noexcept {
  if (buffer.capacity() == 0) return;
  std::lock_guard lock(mutex_);
  try {
    kept_.push_back(std::move(buffer));
  } catch (...) {  // no memory to keep it: free it, and its bytes with it
    held_ -= buffer.capacity();
  }
  wake_all();
}

void ReplyBuffers::lose(std::size_t capacity) noexcept {
  std::lock_guard lock(mutex_);
  lost_ += capacity;
  wake_all();  // a waiter may now never fit: it must fail, not wait
}

std::size_t ReplyBuffers::high_water() const {
  std::lock_guard lock(mutex_);
  return high_water_;
}

void ReplyBuffers::wake_all() {
  for (CompletionSource& w : waiters_) w.complete();
  waiters_.clear();
}

}  // namespace eredu::mpi::detail
