#include "eredu/cpu/executor.hpp"

#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

#if defined(__SANITIZE_THREAD__)
#define EREDU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EREDU_TSAN 1
#endif
#endif
#ifdef EREDU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace eredu::cpu {

namespace detail {

struct ExecutorJob {
  /// `w`, to run on `e`'s arena.
  ExecutorJob(UniqueFunction<void()> w, Executor* e) : work(std::move(w)), executor(e) {}

  CompletionSource source;
  UniqueFunction<void()> work;  // touched only by the one that took the job
  Executor* executor;           // alive while the job is unfinished: its destructor waits
  std::atomic<bool> taken{false};
  std::shared_ptr<ExecutorJob> next_doomed;  // Executor::close's list, under its mutex

  /// True for exactly one caller: the worker that runs the job, or the path that fails it.
  /// A task TBB queued before its enqueue threw may still run later; whichever comes
  /// second finds the job taken, so the completion comes exactly once.
  bool take() noexcept {
    return !taken.load(std::memory_order_relaxed) && !taken.exchange(true, std::memory_order_acq_rel);
  }
  /// Whether its completion has come (run, failed, or failed unrun).
  bool finished() const noexcept { return source.completion().ready(); }

  /// Closes the executor (see Executor::close); returns the error it is closed with.
  std::exception_ptr close_executor(std::exception_ptr error) noexcept { return executor->close(std::move(error)); }

  /// For the caller that took the job: destroys the work unrun, then fails the completion.
  void fail_taken(const std::exception_ptr& error) noexcept {
    // Whoever awaits the completion may rely on what the work captured (leases) being released.
    { UniqueFunction<void()> dropped = std::move(work); }
    source.fail(error);
  }
};

}  // namespace detail

namespace {

using detail::ExecutorJob;

/// TBB's text for a worker thread the system refused (handle_perror's message, thrown from
/// thread_monitor::launch, src/tbb/rml_thread_monitor.h, as std::runtime_error).
bool is_thread_refusal(const std::exception_ptr& error) noexcept {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
    return false;
  } catch (const std::runtime_error& e) {
    return std::string_view(e.what()).starts_with("pthread_");
  } catch (...) {}
  return false;
}

/// Set once TBB failed to start a worker thread anywhere in the process. oneTBB 2021's private
/// RML server pops a sleeping worker and its unit of demand before launching it, and a launch
/// that throws (src/tbb/private_server.cpp, wake_or_launch) leaves that worker "starting" for
/// ever, out of the sleep list: the pool has lost it. On a 2-core machine the pool has one
/// worker, so work queued afterwards on any arena would wait for ever (seen: a Python load
/// after RLIMIT_NPROC was lifted hung in 1 run of 3 under load).
std::atomic<bool> worker_pool_damaged{false};

/// The error of every executor call once the pool is damaged.
std::exception_ptr damaged_pool_error() noexcept {
  try {
    return std::make_exception_ptr(
        Error(errc::resource_exhausted, {},
              "cpu::Executor: the system refused a TBB worker thread earlier in this process, and oneTBB never "
              "starts that worker again, so work queued now might never run: restart the process once the thread "
              "limit (RLIMIT_NPROC, a container's pids limit) leaves room"));
  } catch (...) {
    return typed_failure(std::current_exception());
  }
}

/// Records a refused worker thread (see worker_pool_damaged).
void note_refusal(const std::exception_ptr& error) noexcept {
  if (is_thread_refusal(error)) worker_pool_damaged.store(true, std::memory_order_release);
}

/// What a failed call into TBB (an exception from initialize, enqueue or a spawn inside
/// work) means for the caller: memory (out_of_memory) or a resource the system refused
/// (resource_exhausted), naming what was being done and TBB's own words.
std::exception_ptr refusal_error(const std::exception_ptr& error, const char* doing) noexcept {
  note_refusal(error);
  try {
    try {
      std::rethrow_exception(error);
    } catch (const Error&) {
      return error;
    } catch (const std::bad_alloc&) {
      return std::make_exception_ptr(
          Error(errc::out_of_memory, {}, fmt::format("cpu::Executor: no memory to {} (std::bad_alloc)", doing)));
    } catch (const std::exception& e) {
      return std::make_exception_ptr(
          Error(errc::resource_exhausted, {},
                fmt::format("cpu::Executor: the system refused what TBB needs to {} ({}): worker threads are "
                            "limited by RLIMIT_NPROC or a container's pids limit, and each needs address space "
                            "for its stack",
                            doing, e.what())));
    } catch (...) {
      return std::make_exception_ptr(
          Error(errc::resource_exhausted, {}, fmt::format("cpu::Executor: TBB failed to {}", doing)));
    }
  } catch (...) {
    return typed_failure(std::current_exception());  // no memory to say more
  }
}

/// The functor TBB copies into its task object. libtbb is not built with ThreadSanitizer,
/// so TSan cannot see that enqueueing a task happens before running it; under TSan each
/// copy publishes itself (release) and the run acquires it, making the hand-off visible.
struct HandOff {
  std::shared_ptr<ExecutorJob> job;

  explicit HandOff(std::shared_ptr<ExecutorJob> j) : job(std::move(j)) { publish(); }
  HandOff(const HandOff& other) : job(other.job) { publish(); }
  HandOff(HandOff&& other) noexcept : job(std::move(other.job)) { publish(); }
  HandOff& operator=(const HandOff&) = delete;
  HandOff& operator=(HandOff&&) = delete;

  void publish() {
#ifdef EREDU_TSAN
    __tsan_release(this);
#endif
  }
  // Runs on a TBB worker, where an escaping exception would end the process (TBB asserts
  // on an exception from an enqueued task): every failure goes into the completion.
  void operator()() const {
#ifdef EREDU_TSAN
    __tsan_acquire(const_cast<HandOff*>(this));
#endif
    if (!job->take()) return;  // failed already, by an executor that closed
    std::exception_ptr error;
    {
      // Destroy the work, and whatever it captured (leases, temporaries), before completing:
      // whoever awaits the completion may rely on those being released.
      UniqueFunction<void()> fn = std::move(job->work);
      try {
        fn();
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (is_thread_refusal(error)) {
      // A parallel algorithm inside the work could not start a worker: TBB's bookkeeping of
      // this arena is now mid-update for good, as after a failed enqueue.
      error = job->close_executor(refusal_error(error, "run parallel work"));
    } else {
      error = typed_failure(std::move(error));
    }
    job->source.finish(std::move(error));
  }
};

/// Drops predecessors that have finished successfully; failed ones stay so that work
/// ordered after them keeps failing rather than running on bad inputs.
void prune_predecessors(std::vector<Completion>& completions) {
  std::erase_if(completions, [](const Completion& c) { return c.ready() && !c.error(); });
}

/// Drops finished work (its failure was reported through its own completion).
void prune_finished(std::vector<std::shared_ptr<ExecutorJob>>& jobs) {
  std::erase_if(jobs, [](const std::shared_ptr<ExecutorJob>& j) { return j->finished(); });
}

int checked_concurrency(int concurrency) {
  if (concurrency == Executor::automatic) return tbb::this_task_arena::max_concurrency();
  if (concurrency < 1 || concurrency > Executor::max_concurrency) {
    throw Error(errc::invalid_argument, {},
                fmt::format("cpu::Executor concurrency is {}; it must be Executor::automatic (-1) or 1..{}",
                            concurrency, Executor::max_concurrency));
  }
  return concurrency;
}

}  // namespace

Executor::Executor(int concurrency) : concurrency_(checked_concurrency(concurrency)) {
  if (worker_pool_damaged.load(std::memory_order_acquire)) std::rethrow_exception(damaged_pool_error());
  try {
    // No slot reserved for an application thread: work arrives by enqueue from the event
    // loop, which never joins the arena, so every slot must be open to TBB's workers.
    arena_ = std::make_unique<tbb::task_arena>(concurrency_, 0);
    // Now, not lazily at the first enqueue: TBB initializes an arena once, through
    // atomic_do_once (oneapi/tbb/detail/_utils.h), which leaves its state "pending" when the
    // initialization throws, and every later call on the arena then spins for ever waiting
    // for it. Here a failure is the constructor's, and the arena is never called again.
    arena_->initialize();
  } catch (...) {
    std::rethrow_exception(refusal_error(std::current_exception(), "start its task arena"));
  }
}

Executor::~Executor() {
  // Waits for the work submitted (also from inside work, meanwhile), one job at a time so
  // that waiting needs no allocation. A predecessor that never completes holds the
  // destructor only through the work ordered after it.
  for (;;) {
    std::shared_ptr<ExecutorJob> unfinished;
    {
      std::lock_guard lock(mutex_);
      for (const auto& job : jobs_) {
        if (!job->finished()) {
          unfinished = job;
          break;
        }
      }
    }
    if (!unfinished) break;
    unfinished->source.completion().wait();
  }
  // A closed executor's arena is left to the process: TBB may still hold its bookkeeping
  // mid-update, and terminating it could wait for that for ever.
  if (closed_error()) (void)arena_.release();
}

Completion Executor::submit(UniqueFunction<void()> work) {
  std::shared_ptr<ExecutorJob> job;
  try {
    job = std::make_shared<ExecutorJob>(std::move(work), this);
  } catch (...) {
    std::rethrow_exception(typed_failure(std::current_exception()));
  }
  Completion done = job->source.completion();
  try {
    Completion after;
    std::exception_ptr closed;
    {
      std::lock_guard lock(mutex_);
      closed = closed_;
      if (!closed) {
        prune_predecessors(predecessors_);
        prune_finished(jobs_);
        jobs_.push_back(job);
        if (!predecessors_.empty()) after = when_all(predecessors_);
      }
    }
    if (closed) {
      if (job->take()) job->fail_taken(closed);
    } else if (after.valid()) {
      after.on_complete([this, job](std::exception_ptr predecessor_error) {
        if (!predecessor_error) {
          enqueue(job);
        } else if (job->take()) {
          job->fail_taken(predecessor_error);
        }
      });
    } else {
      enqueue(job);
    }
  } catch (...) {
    // No memory for the bookkeeping: this work fails, the executor stays usable.
    if (job->take()) job->fail_taken(typed_failure(std::current_exception()));
  }
  return done;
}

void Executor::enqueue(const std::shared_ptr<ExecutorJob>& job) noexcept {
  std::exception_ptr failure;
  {
    std::lock_guard serial(enqueue_mutex_);
    failure = closed_error();
    if (!failure && worker_pool_damaged.load(std::memory_order_acquire)) {
      // Another executor lost a worker of the shared pool: this arena may have none left.
      std::lock_guard lock(mutex_);
      if (!closed_) closed_ = damaged_pool_error();
      failure = closed_;
    }
    if (!failure) {
      try {
        arena_->enqueue(HandOff(job));
        return;
      } catch (...) {
        failure = refusal_error(std::current_exception(), "queue work on its task arena");
      }
      // Marked closed before another enqueue may enter the arena; the jobs are failed
      // below, outside this lock (their callbacks may submit again).
      std::lock_guard lock(mutex_);
      if (!closed_) closed_ = failure;
      failure = closed_;
    }
  }
  close(failure);
}

std::exception_ptr Executor::close(std::exception_ptr error) noexcept {
  // The jobs to fail are chained through the jobs themselves: this may run because memory
  // ran out, and must not touch the executor once the last of them has failed (its owner
  // may be destroying it then).
  std::shared_ptr<ExecutorJob> doomed;
  {
    std::lock_guard lock(mutex_);
    if (!closed_) closed_ = std::move(error);
    error = closed_;
    for (const auto& job : jobs_) {
      if (!job->take()) continue;
      job->next_doomed = std::move(doomed);
      doomed = job;
    }
  }
  // Outside the lock: a failed job's callbacks may call back into the executor.
  while (doomed) {
    std::shared_ptr<ExecutorJob> job = std::move(doomed);
    doomed = std::move(job->next_doomed);
    job->fail_taken(error);
  }
  return error;
}

std::exception_ptr Executor::closed_error() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

void Executor::order_after(const Completion& completion) {
  std::lock_guard lock(mutex_);
  // A loop of collectives orders after each one and may never submit (where the others are
  // pruned): without this the list grows by one completion per collective, for ever.
  prune_predecessors(predecessors_);
  predecessors_.push_back(completion);
}

Completion Executor::fence() {
  std::lock_guard lock(mutex_);
  prune_finished(jobs_);
  prune_predecessors(predecessors_);
  // Stream semantics: what is ordered before now includes the completions passed to
  // order_after, not only the work submitted (a collective started after order_after(gate)
  // must wait for the gate, as on a CUDA stream).
  std::vector<Completion> before;
  before.reserve(jobs_.size() + predecessors_.size());
  for (const auto& job : jobs_) before.push_back(job->source.completion());
  before.insert(before.end(), predecessors_.begin(), predecessors_.end());
  return when_all(before);
}

std::vector<std::unique_ptr<Executor>> Executor::fork(std::size_t count) const {
  std::vector<std::unique_ptr<Executor>> lanes;
  lanes.reserve(count);
  for (std::size_t i = 0; i < count; ++i) lanes.push_back(std::make_unique<Executor>(concurrency_));
  return lanes;
}

void Executor::run_blocking(UniqueFunction<void()> fn) {
  if (std::exception_ptr closed = closed_error()) std::rethrow_exception(closed);
  try {
    arena_->execute([&] { fn(); });
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    if (is_thread_refusal(error)) std::rethrow_exception(close(refusal_error(error, "run parallel work")));
    std::rethrow_exception(typed_failure(std::move(error)));
  }
}

}  // namespace eredu::cpu
