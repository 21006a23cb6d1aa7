#include "eredu/cpu/executor.hpp"

#include <tbb/task_arena.h>

#include <algorithm>

namespace eredu::cpu {
namespace {

/// Drops predecessors that have finished successfully; failed ones stay so that work
/// ordered after them keeps failing rather than running on bad inputs.
void prune_predecessors(std::vector<Completion>& completions) {
  std::erase_if(completions, [](const Completion& c) { return c.ready() && !c.error(); });
}

/// Drops finished work (its failure was reported through its own completion).
void prune_finished(std::vector<Completion>& completions) {
  std::erase_if(completions, [](const Completion& c) { return c.ready(); });
}

}  // namespace

Executor::Executor(int concurrency)
    : concurrency_(concurrency == automatic ? tbb::this_task_arena::max_concurrency() : std::max(1, concurrency)),
      arena_(std::make_unique<tbb::task_arena>(concurrency_)) {}

Executor::~Executor() { fence().wait(); }

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
    arena_->enqueue([source, task] {
      try {
        (*task)();
        source->complete();
      } catch (...) {
        source->fail(std::current_exception());
      }
    });
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
  predecessors_.push_back(completion);
}

Completion Executor::fence() {
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
