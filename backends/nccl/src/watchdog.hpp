#pragma once
// The watchdog (private to eredu::nccl): one thread per process that runs an action at a
// deadline unless it was cancelled first. NCCL kernels that wait for a peer never fail by
// themselves, so a collective's timeout needs someone other than the stream to notice it; the
// action fails the collective's completion and aborts its communicator, which ends the kernels.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "eredu/core/unique_function.hpp"

namespace eredu::nccl::detail {

/// Deadlines and their actions (see file comment). Thread-safe.
class Watchdog {
 public:
  /// Identifies one armed action.
  using Id = std::uint64_t;
  using Clock = std::chrono::steady_clock;

  /// Starts the thread.
  Watchdog();
  /// Runs nothing more; joins the thread.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Runs `action` on the watchdog's thread at `deadline` unless cancel() comes first.
  Id arm(Clock::time_point deadline, UniqueFunction<void()> action);
  /// Drops the action of `id` if it has not run (or started) yet.
  void cancel(Id id);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::pair<Clock::time_point, Id>, UniqueFunction<void()>> due_;  // by deadline
  std::map<Id, Clock::time_point> armed_;                                   // for cancel
  Id next_ = 1;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

/// The process's watchdog, started on first use.
Watchdog& watchdog();

}  // namespace eredu::nccl::detail
