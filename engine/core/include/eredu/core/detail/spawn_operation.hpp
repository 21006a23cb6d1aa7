#pragma once
/// \file
/// spawn_operation: asio::co_spawn for eredu's public async operations, with one difference
/// that callers can rely on — a cancellation emitted before the coroutine's first step,
/// which Asio reports as std::system_error(asio::error::operation_aborted), completes with
/// eredu::Error(errc::cancelled) like a cancellation that lands later. So every cancelled
/// eredu operation fails the same typed way, whenever the signal came.

#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <exception>
#include <system_error>
#include <utility>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/error.hpp"

namespace eredu::detail {

/// `error`, with Asio's operation_aborted replaced by eredu::Error(cancelled).
inline std::exception_ptr typed_cancellation(std::exception_ptr error) {
  if (!error) return error;
  try {
    std::rethrow_exception(error);
  } catch (const std::system_error& e) {
    if (e.code() == asio::error::operation_aborted && !dynamic_cast<const Error*>(&e))
      return std::make_exception_ptr(Error(errc::cancelled, {}, "the operation was cancelled before it started"));
  } catch (...) {}
  return error;
}

/// Runs `op` on `executor` and completes `token` with void(std::exception_ptr, T) (or
/// void(std::exception_ptr) for T = void) on the token's executor; see file comment.
template <class T, class Executor, class Token>
auto spawn_operation(const Executor& executor, asio::awaitable<T> op, Token&& token) {
  if constexpr (std::is_void_v<T>) {
    return asio::async_initiate<Token, void(std::exception_ptr)>(
        [executor](auto handler, asio::awaitable<void> work) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          auto deliver = deliver_on_handler_executor<std::exception_ptr>(std::move(handler), executor);
          asio::co_spawn(executor, std::move(work),
                         asio::bind_cancellation_slot(slot, [d = std::move(deliver)](std::exception_ptr e) mutable {
                           d(typed_cancellation(e));
                         }));
        },
        token, std::move(op));
  } else {
    return asio::async_initiate<Token, void(std::exception_ptr, T)>(
        [executor](auto handler, asio::awaitable<T> work) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          auto deliver = deliver_on_handler_executor<std::exception_ptr, T>(std::move(handler), executor);
          asio::co_spawn(
              executor, std::move(work),
              asio::bind_cancellation_slot(slot, [d = std::move(deliver)](std::exception_ptr e, T value) mutable {
                d(typed_cancellation(e), std::move(value));
              }));
        },
        token, std::move(op));
  }
}

}  // namespace eredu::detail
