#pragma once
/// \file
/// A completion token for a wait inside a coroutine that the coroutine's own cancellation
/// slot must not reach: the coroutine handles cancellation itself (a handler it assigned to
/// that slot, which a cancellable wait would replace), or the wait must end whatever the
/// caller cancels (a drain that reopens a gate afterwards).

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_awaitable.hpp>

namespace eredu::detail {

/// asio::use_awaitable with no cancellation slot bound (see file comment).
inline auto use_awaitable_ignoring_cancellation() {
  return asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
}

}  // namespace eredu::detail
