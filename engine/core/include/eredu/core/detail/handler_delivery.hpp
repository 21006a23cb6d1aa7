#pragma once
/// \file
/// Turning an Asio completion handler into a type-erased, move-only callback that may be
/// invoked from any thread and always runs the handler on the handler's own executor.

#include <asio/associated_allocator.hpp>
#include <asio/associated_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <tuple>
#include <utility>

#include "eredu/core/unique_function.hpp"

namespace eredu::detail {

/// Wraps `handler` so that calling the result with Args posts the handler, with those
/// arguments, to its associated executor (or `fallback` when it has none). A work guard
/// keeps that executor's context alive until then. Never runs the handler inline, so a
/// reaping loop or a releasing destructor never resumes a coroutine in the middle of its
/// own work.
template <class... Args, class Handler, class Executor>
UniqueFunction<void(Args...)> deliver_on_handler_executor(Handler handler, const Executor& fallback) {
  auto ex = asio::get_associated_executor(handler, fallback);
  auto work = asio::make_work_guard(ex);
  return [h = std::move(handler), w = std::move(work)](Args... args) mutable {
    auto ex2 = w.get_executor();
    asio::post(ex2, [h = std::move(h), w = std::move(w), t = std::make_tuple(std::forward<Args>(args)...)]() mutable {
      std::apply(h, std::move(t));
    });
  };
}

}  // namespace eredu::detail
