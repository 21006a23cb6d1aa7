#pragma once
/// \file
/// eredu::AsyncEvent: an event that coroutines and callbacks wait for without blocking a
/// thread — set when what they wait for has happened, reset when they must wait again (a
/// manual-reset event, as cppcoro's async_manual_reset_event, with an Asio initiating function
/// for the wait).
///
/// It is the condition variable of code whose waiters are coroutines. The waiter checks its
/// condition under its own mutex and, when it must wait, reset()s the event before it lets the
/// mutex go; whoever changes the condition set()s the event under that mutex:
///
/// \code
///   for (;;) {
///     {
///       std::lock_guard lock(mutex);
///       if (ready()) break;
///       changed.reset();
///     }
///     co_await changed.async_wait(asio::use_awaitable);  // then check again
///   }
/// \endcode
///
/// No wake-up is lost: a set() after the check completes the wait, even one initiated after the
/// set(). None is spurious: a set() before the check is cleared by the reset(). A set() may run
/// under the caller's mutex because a wait never completes inline: its handler is posted.
///
/// Thread-safe: set(), reset(), is_set() and async_wait() may be called from any thread.

#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/system_executor.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/unique_function.hpp"

namespace eredu {

/// A manual-reset event with asynchronous waits (see file comment). Neither copyable nor
/// movable: pending waits refer to it.
class AsyncEvent {
 public:
  /// An event that is set (waits complete at once) or not (waits pend until set()).
  explicit AsyncEvent(bool initially_set = false);
  /// Fails every pending wait with eredu::Error(cancelled); a wait initiated later (a stored
  /// deferred one) fails the same way.
  ~AsyncEvent();
  AsyncEvent(const AsyncEvent&) = delete;
  AsyncEvent& operator=(const AsyncEvent&) = delete;

  /// Sets the event: completes every pending wait, and every later one until reset().
  void set() noexcept;
  /// Clears the event: later waits pend until the next set(). Pending waits keep waiting.
  void reset() noexcept;
  /// True while set.
  bool is_set() const noexcept;
  /// Waits pending now (for tests and diagnostics).
  std::size_t waiting() const noexcept;

  /// Waits until the event is set (at once if it is set now).
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr)`: null once the event is set; eredu::Error(cancelled) when the
  /// wait is cancelled or the event is destroyed first. The handler runs on its associated
  /// executor (asio::system_executor if it has none), never inline, not even when the event
  /// is set already.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: a cancelled wait completes with Error(cancelled) and has no
  /// other effect (the event, and the other waits, are as they were).
  ///
  /// Nothing needs to outlive the operation: a wait keeps the event's state alive.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_wait(Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr)>(
        [](auto handler, std::shared_ptr<State> state) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          auto done = eredu::detail::deliver_on_handler_executor<std::exception_ptr>(std::move(handler),
                                                                                     asio::system_executor());
          const std::uint64_t id = add_waiter(state, std::move(done));
          if (id != 0 && slot.is_connected()) {
            slot.assign([weak = std::weak_ptr<State>(state), id](asio::cancellation_type type) {
              if (type != asio::cancellation_type::none) cancel_waiter(weak, id);
            });
          }
        },
        token, state_);
  }

 private:
  struct State;
  /// Completes `done` at once (returns 0) or queues it (returns the wait's id).
  static std::uint64_t add_waiter(const std::shared_ptr<State>& state, UniqueFunction<void(std::exception_ptr)> done);
  /// Fails the wait `id` with Error(cancelled) if it is still pending.
  static void cancel_waiter(const std::weak_ptr<State>& state, std::uint64_t id);

  std::shared_ptr<State> state_;
};

}  // namespace eredu
