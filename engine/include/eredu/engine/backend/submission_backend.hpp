#pragma once
/// \file
/// The SubmissionBackend concept: backend executors (TBB arenas, CUDA streams) whose
/// submitted work completes as an eredu::Completion (the seed's `SubmissionBackend`).

#include <concepts>
#include <cstddef>
#include <memory>
#include <vector>

#include "eredu/core/completion.hpp"

namespace eredu::engine {

/// A backend whose work is submitted to executors and ordered by completions.
///
/// - `B::Executor`: a queue, arena or stream;
/// - `B::fork_executors(ex, n)`: n independently schedulable executors on the same device;
/// - `B::submit(ex)`: a completion for everything submitted to `ex` so far;
/// - `B::order_after(c, ex)`: later work on `ex` starts after `c`;
/// - `B::retain_until_complete(ex, c, value)`: keeps `value` alive until `c` has completed.
template <class B>
concept SubmissionBackend = requires {
  typename B::Executor;
}
&&requires(typename B::Executor& executor, const Completion& completion, std::size_t count) {
  { B::fork_executors(executor, count) } -> std::same_as<std::vector<std::unique_ptr<typename B::Executor>>>;
  { B::submit(executor) } -> std::same_as<Completion>;
  B::order_after(completion, executor);
  B::retain_until_complete(executor, completion, std::make_unique<int>(0));
};

}  // namespace eredu::engine
