#include "eredu/core/async_event.hpp"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "eredu/core/error.hpp"

namespace eredu {

struct AsyncEvent::State {
  struct Waiter {
    std::uint64_t id;
    UniqueFunction<void(std::exception_ptr)> done;
  };
  mutable std::mutex mutex;
  bool set = false;
  bool destroyed = false;  // the AsyncEvent is gone: nobody can set it any more
  std::uint64_t next_id = 1;
  std::vector<Waiter> waiters;  // in arrival order
};

AsyncEvent::AsyncEvent(bool initially_set) : state_(std::make_shared<State>()) { state_->set = initially_set; }

AsyncEvent::~AsyncEvent() {
  std::vector<State::Waiter> waiters;
  {
    std::lock_guard lock(state_->mutex);
    state_->destroyed = true;
    waiters.swap(state_->waiters);
  }
  if (waiters.empty()) return;
  auto error = std::make_exception_ptr(Error(errc::cancelled, {}, "the event was destroyed before it was set"));
  for (auto& w : waiters) w.done(error);
}

void AsyncEvent::set() noexcept {
  std::vector<State::Waiter> waiters;
  {
    std::lock_guard lock(state_->mutex);
    state_->set = true;
    waiters.swap(state_->waiters);
  }
  // Each completion only posts its handler, so none of them runs user code here.
  for (auto& w : waiters) w.done(nullptr);
}

void AsyncEvent::reset() noexcept {
  std::lock_guard lock(state_->mutex);
  state_->set = false;
}

bool AsyncEvent::is_set() const noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->set;
}

std::size_t AsyncEvent::waiting() const noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->waiters.size();
}

std::uint64_t AsyncEvent::add_waiter(const std::shared_ptr<State>& state,
                                     UniqueFunction<void(std::exception_ptr)> done) {
  std::unique_lock lock(state->mutex);
  if (state->set) {
    lock.unlock();
    done(nullptr);
    return 0;
  }
  if (state->destroyed) {
    lock.unlock();
    done(std::make_exception_ptr(Error(errc::cancelled, {}, "the event was destroyed before it was set")));
    return 0;
  }
  const std::uint64_t id = state->next_id++;
  state->waiters.push_back({id, std::move(done)});
  return id;
}

void AsyncEvent::cancel_waiter(const std::weak_ptr<State>& weak, std::uint64_t id) {
  std::shared_ptr<State> state = weak.lock();
  if (!state) return;
  UniqueFunction<void(std::exception_ptr)> done;
  {
    std::lock_guard lock(state->mutex);
    auto it =
        std::find_if(state->waiters.begin(), state->waiters.end(), [id](const State::Waiter& w) { return w.id == id; });
    if (it == state->waiters.end()) return;  // completed already
    done = std::move(it->done);
    state->waiters.erase(it);
  }
  done(std::make_exception_ptr(Error(errc::cancelled, {}, "the wait for an event was cancelled")));
}

}  // namespace eredu
