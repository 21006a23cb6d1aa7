#include "eredu/cpu/executor.hpp"

#include <tbb/task_arena.h>

#include <algorithm>

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
namespace {

/// The functor TBB copies into its task object. libtbb is not built with ThreadSanitizer,
/// so TSan cannot see that enqueueing a task happens before running it; under TSan each
/// copy publishes itself (release) and the run acquires it, making the hand-off visible.
struct HandOff {
  std::shared_ptr<CompletionSource> source;
  std::shared_ptr<UniqueFunction<void()>> work;

  HandOff(std::shared_ptr<CompletionSource> s, std::shared_ptr<UniqueFunction<void()>> w)
      : source(std::move(s)), work(std::move(w)) {
    publish();
  }
  HandOff(const HandOff& other) : source(other.source), work(other.work) { publish(); }
  HandOff(HandOff&& other) noexcept : source(std::move(other.source)), work(std::move(other.work)) { publish(); }
  HandOff& operator=(const HandOff&) = delete;
  HandOff& operator=(HandOff&&) = delete;

  void publish() {
#ifdef EREDU_TSAN
    __tsan_release(this);
#endif
  }
  void operator()() const {
#ifdef EREDU_TSAN
    __tsan_acquire(const_cast<HandOff*>(this));
#endif
    std::exception_ptr error;
    {
      // Destroy the work, and whatever it captured (leases, temporaries), before completing:
      // whoever awaits the completion may rely on those being released.
      UniqueFunction<void()> fn = std::move(*work);
      try {
        fn();
      } catch (...) {
        error = std::current_exception();
      }
    }
    source->finish(std::move(error));
  }
};

/// Drops predecessors that have finished successfully; failed ones stay so that work
/// ordered after them keeps failing rather than running on bad inputs.
void prune_predecessors(std::vector<Completion>& completions) {
  std::erase_if(completions, [](const Completion& c) { return c.ready() && !c.error(); });
}

/// Drops finished work (its failure was reported through its own completion).
void prune_finished(std::vector<Completion>& completions) {
  std::erase_if(completions, [](const Completion& c) { return c.ready(); });
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

Executor::Executor(int concurrency)
    : concurrency_(checked_concurrency(concurrency)),
      // No slot reserved for an application thread: work arrives by enqueue from the event
      // loop, which never joins the arena, so every slot must be open to TBB's workers.
      arena_(std::make_unique<tbb::task_arena>(concurrency_, 0)) {}

// Only the work that runs on the arena must end before it goes; a predecessor that never
// completes (a gate nobody opens) must not hold the destructor.
Executor::~Executor() { submitted_work().wait(); }

Completion Executor::submit(UniqueFunction<void()> work) {
  auto source = std::make_shared<CompletionSource>();
  Completion done = source->completion();
  auto run = [this, source, work = std::move(work)](std::exception_ptr predecessor_error) mutable {
    if (predecessor_error) {
      source->fail(predecessor_error);
      return;
    }
    // The arena copies its functor; the move-only work travels in a shared holder.
    auto task = std::make_shared<UniqueFunction<void()>>(std::move(work));
    arena_->enqueue(HandOff(source, std::move(task)));
  };
  Completion after;
  {
    std::lock_guard lock(mutex_);
    prune_predecessors(predecessors_);
    prune_finished(outstanding_);
    outstanding_.push_back(done);
    if (!predecessors_.empty()) after = when_all(predecessors_);
  }
  if (after.valid())
    after.on_complete(std::move(run));
  else
    run(nullptr);
  return done;
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
  prune_finished(outstanding_);
  prune_predecessors(predecessors_);
  // Stream semantics: what is ordered before now includes the completions passed to
  // order_after, not only the work submitted (a collective started after order_after(gate)
  // must wait for the gate, as on a CUDA stream).
  std::vector<Completion> before = outstanding_;
  before.insert(before.end(), predecessors_.begin(), predecessors_.end());
  return when_all(before);
}

Completion Executor::submitted_work() {
  std::lock_guard lock(mutex_);
  prune_finished(outstanding_);
  return when_all(outstanding_);
}

std::vector<std::unique_ptr<Executor>> Executor::fork(std::size_t count) const {
  std::vector<std::unique_ptr<Executor>> lanes;
  lanes.reserve(count);
  for (std::size_t i = 0; i < count; ++i) lanes.push_back(std::make_unique<Executor>(concurrency_));
  return lanes;
}

void Executor::run_blocking(UniqueFunction<void()> fn) {
  arena_->execute([&] { fn(); });
}

}  // namespace eredu::cpu
