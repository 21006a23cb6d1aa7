#pragma once
/// \file
/// eredu::cpu::Executor: a oneTBB task arena as a backend executor (SubmissionBackend).
///
/// Work submitted to an executor runs on the arena's worker threads; its result is an
/// eredu::Completion, so a coroutine co_awaits it and resumes on its own Asio executor,
/// never inside a TBB worker. An arena's concurrency bounds how many cores the work may
/// use: a background load (hot-swap) gets a small arena, so serving keeps priority.
///
/// TBB starts (hardware threads - 1) workers by default, assuming the application thread
/// joins the work. Here it does not (the event loop only enqueues), so an application that
/// wants every core busy raises the limit once, process-wide:
/// `tbb::global_control workers(tbb::global_control::max_allowed_parallelism, threads + 1);`
/// (`eredu load` does). Executors cannot do it themselves: TBB applies the smallest limit of
/// all live global_control objects.

#include <tbb/task_arena.h>

#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/retain_until_complete.hpp"
#include "eredu/core/unique_function.hpp"

namespace eredu::cpu {

namespace detail {
/// One submitted piece of work and its completion (defined in executor.cpp).
struct ExecutorJob;
}  // namespace detail

/// A TBB arena that runs submitted work and reports each as a Completion. Not movable
/// (tasks refer to it); own it through std::unique_ptr to pass it around. The destructor
/// waits for the work already submitted.
///
/// When the system refuses what the arena needs (a worker thread: RLIMIT_NPROC, a pids
/// limit, the address space for its stack; or memory), the call that needed it fails with
/// eredu::Error(resource_exhausted) or (out_of_memory): the constructor, or the submitted
/// work's completion. A refusal while queueing work leaves TBB's arena unusable (its demand
/// bookkeeping stays mid-update, and a later call would wait for ever), so the executor
/// closes: the work not yet run, and everything submitted later, fails with the same error.
/// A refused worker thread also damages TBB's process-wide worker pool: oneTBB 2021 never
/// launches that worker again, and on a small machine (one worker per core but one) no worker
/// may be left to run anything an arena queues. So once a thread has been refused, every
/// Executor in the process fails at once with resource_exhausted, in its constructor or its
/// submissions, rather than queue work that may never run.
class Executor {
 public:
  /// Value of `concurrency` that means "every hardware thread".
  static constexpr int automatic = -1;
  /// Largest accepted concurrency: far above any core count TBB schedules well, and low
  /// enough that a typo (100000) is refused at once instead of building a huge arena.
  static constexpr int max_concurrency = 1024;

  /// An arena of `concurrency` threads (including the thread that submits, as TBB counts):
  /// `automatic` or 1..max_concurrency, else eredu::Error(invalid_argument) naming the range.
  explicit Executor(int concurrency = automatic);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Threads the arena may use.
  int concurrency() const noexcept { return concurrency_; }

  /// Runs `work` on the arena once every completion passed to order_after has finished;
  /// an exception it throws fails the returned completion, as does a failed predecessor.
  Completion submit(UniqueFunction<void()> work);

  /// Orders work submitted from now on after `completion` (the seed's order_after).
  void order_after(const Completion& completion);

  /// A completion that finishes when all work submitted so far, and every completion passed
  /// to order_after so far, has (stream semantics: what a collective or a submission point
  /// started now comes after). It fails with the first failure among them.
  Completion fence();

  /// Keeps `value` alive until `completion` has finished, then destroys it on the
  /// completing thread (eredu::retain_until_complete, the one definition).
  template <class T>
  static void retain_until_complete(const Completion& completion, T value) {
    eredu::retain_until_complete(completion, std::move(value));
  }

  /// `count` new executors on the same cores, each with this one's concurrency, for
  /// independently scheduled lanes.
  std::vector<std::unique_ptr<Executor>> fork(std::size_t count) const;

  /// Runs `fn` on the calling thread inside the arena and waits for it (parallel algorithms
  /// inside it then use this arena's threads). For synchronous callers and tests.
  void run_blocking(UniqueFunction<void()> fn);

  /// The error the executor closed with (see the class comment), or null while it is usable.
  std::exception_ptr closed_error() const;

 private:
  friend struct detail::ExecutorJob;  // a job closes its executor when TBB refuses a thread

  /// Queues `job` on the arena, or fails it if the executor is closed or closes now.
  void enqueue(const std::shared_ptr<detail::ExecutorJob>& job) noexcept;
  /// Closes the executor with `error` (the first error wins) and fails every job not yet
  /// taken by a worker. Returns the error the executor is closed with.
  std::exception_ptr close(std::exception_ptr error) noexcept;

  int concurrency_;
  std::unique_ptr<tbb::task_arena> arena_;
  mutable std::mutex mutex_;  // guards predecessors_, jobs_ and closed_
  std::vector<Completion> predecessors_;
  std::vector<std::shared_ptr<detail::ExecutorJob>> jobs_;  // submitted, not known to be finished
  std::exception_ptr closed_;
  // Serialises calls into the arena, so that none is under way when one fails and the
  // executor closes: TBB would make it wait for ever for the failed call's bookkeeping.
  std::mutex enqueue_mutex_;
};

}  // namespace eredu::cpu
