#include "watchdog.hpp"

namespace eredu::nccl::detail {

Watchdog::Watchdog() : thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

Watchdog::Id Watchdog::arm(Clock::time_point deadline, UniqueFunction<void()> action) {
  Id id = 0;
  bool earliest = false;
  {
    std::lock_guard lock(mutex_);
    id = next_++;
    earliest = due_.empty() || deadline < due_.begin()->first.first;
    due_.emplace(std::make_pair(deadline, id), std::move(action));
    armed_.emplace(id, deadline);
  }
  if (earliest) wake_.notify_one();  // the thread sleeps until the old earliest deadline
  return id;
}

void Watchdog::cancel(Id id) {
  UniqueFunction<void()> dropped;  // destroyed off the lock: it may hold the last handle of anything
  std::lock_guard lock(mutex_);
  const auto at = armed_.find(id);
  if (at == armed_.end()) return;
  const auto entry = due_.find(std::make_pair(at->second, id));
  if (entry != due_.end()) {
    dropped = std::move(entry->second);
    due_.erase(entry);
  }
  armed_.erase(at);
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (due_.empty()) {
      wake_.wait(lock);
      continue;
    }
    const auto first = due_.begin();
    if (Clock::now() < first->first.first) {
      wake_.wait_until(lock, first->first.first);
      continue;
    }
    UniqueFunction<void()> action = std::move(first->second);
    armed_.erase(first->first.second);
    due_.erase(first);
    lock.unlock();
    action();  // never under the lock: it aborts a communicator and completes a completion
    action = UniqueFunction<void()>();
    lock.lock();
  }
}

Watchdog& watchdog() {
  static Watchdog instance;
  return instance;
}

}  // namespace eredu::nccl::detail
