#pragma once
/// \file
/// spawn_operation: the one way a multi-step eredu operation (an asio::awaitable coroutine)
/// becomes an Asio initiating function, in io, engine and backends alike. It is asio::co_spawn
/// on the object's executor, completing the caller's token with
/// `void(std::exception_ptr[, T])`, with three guarantees callers can rely on:
///
///  * Cancellation is typed. Asio reports some cancellations as
///    std::system_error(asio::error::operation_aborted): one emitted before the coroutine's
///    first step, or one that a later co_await turns into that exception. spawn_operation
///    completes those with eredu::Error(errc::cancelled), like a cancellation the operation
///    reports itself, so every cancelled eredu operation fails the same typed way whenever
///    the signal came.
///  * The coroutine and the executor are arguments of the initiation, never captures, so a
///    deferred token (asio::experimental::deferred, an awaitable stored before it is awaited)
///    may launch the operation after the initiating call's temporaries are gone.
///  * The caller's handler keeps its associated executor, allocator and cancellation slot (the
///    asio::associator specialisation below): it runs on its own executor, as co_spawn's
///    handlers do (posted, or dispatched once the coroutine has switched context), and the
///    slot reaches the coroutine.
///
/// Per-operation cancellation of every spawned operation: terminal only (co_spawn filters
/// out partial and total); the coroutine reads it through asio::this_coro::cancellation_state.

#include <asio/any_io_executor.hpp>
#include <asio/associator.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <exception>
#include <system_error>
#include <type_traits>
#include <utility>

#include "eredu/core/error.hpp"

namespace eredu::detail {

/// `error`, with Asio's operation_aborted replaced by eredu::Error(cancelled).
inline std::exception_ptr typed_cancellation(std::exception_ptr error) {
  if (!error) return error;
  try {
    std::rethrow_exception(error);
  } catch (const std::system_error& e) {
    if (e.code() == asio::error::operation_aborted && !dynamic_cast<const Error*>(&e))
      return std::make_exception_ptr(Error(errc::cancelled, {}, "the operation was cancelled"));
  } catch (...) {}
  return error;
}

/// The completion signature of an operation whose coroutine returns T.
template <class T>
struct OperationSignature {
  using type = void(std::exception_ptr, T);  ///< error first, then the result
};
/// The completion signature of an operation whose coroutine returns nothing.
template <>
struct OperationSignature<void> {
  using type = void(std::exception_ptr);  ///< the error alone
};
/// `void(std::exception_ptr, T)`, or `void(std::exception_ptr)` for T = void.
template <class T>
using operation_signature_t = typename OperationSignature<T>::type;

/// The handler spawn_operation gives co_spawn: calls `Handler` with the error made typed
/// (typed_cancellation). Its associations are the wrapped handler's (see below).
template <class Handler>
class TypedCancellationHandler {
 public:
  /// Wraps `handler`.
  explicit TypedCancellationHandler(Handler handler) : handler_(std::move(handler)) {}

  /// Completes the wrapped handler.
  template <class... Values>
  void operator()(std::exception_ptr error, Values&&... values) {
    std::move(handler_)(typed_cancellation(std::move(error)), std::forward<Values>(values)...);
  }

  /// The wrapped handler (for its associations).
  const Handler& get() const noexcept { return handler_; }

 private:
  Handler handler_;
};

/// Runs `op` on `executor` as the initiating function of `token` (see file comment); the
/// completion signature is operation_signature_t<T>.
template <class T, class Token>
auto spawn_operation(asio::any_io_executor executor, asio::awaitable<T> op, Token&& token) {
  return asio::async_initiate<Token, operation_signature_t<T>>(
      [](auto handler, asio::any_io_executor ex, asio::awaitable<T> work) {
        asio::co_spawn(ex, std::move(work), TypedCancellationHandler<decltype(handler)>(std::move(handler)));
      },
      token, std::move(executor), std::move(op));
}

}  // namespace eredu::detail

namespace asio {

/// A TypedCancellationHandler has the associated executor, allocator and cancellation slot
/// of the handler it wraps.
template <template <class, class> class Associator, class Handler, class DefaultCandidate>
struct associator<Associator, eredu::detail::TypedCancellationHandler<Handler>, DefaultCandidate> {
  /// The wrapped handler's association.
  using type = typename Associator<Handler, DefaultCandidate>::type;
  /// Gets the wrapped handler's association.
  static type get(const eredu::detail::TypedCancellationHandler<Handler>& h,
                  const DefaultCandidate& c = DefaultCandidate()) noexcept {
    return Associator<Handler, DefaultCandidate>::get(h.get(), c);
  }
};

}  // namespace asio
