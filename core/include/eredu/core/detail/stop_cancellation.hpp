#pragma once
/// \file
/// StopCancellation: a std::stop_token turned into Asio per-operation cancellation. A unit's
/// realization is stopped through a stop_token, while the reads it awaits (a source's
/// async_read_into, a stream's async_next) are stopped through their cancellation slot: awaited
/// with this object's token, such a read drops its queued requests when the unit stops,
/// instead of reading on to its end before the realization sees the stop.

#include <asio/any_io_executor.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <memory>
#include <stop_token>
#include <utility>

namespace eredu::detail {

/// Emits terminal cancellation on its slot once `stop` is stopped (see file comment). Asio's
/// slots are not thread-safe, and a stop may be requested on any thread: the emission is
/// posted to `executor`, which must be where the awaited operations start, one handler at a
/// time (a loop run by one thread, as eredu's are). Stopped already, it emits at the first
/// chance. Lives in the awaiting coroutine's frame; an emission still queued when it is gone
/// reaches nothing.
class StopCancellation {
 public:
  /// Watches `stop`; emits on `executor`.
  StopCancellation(std::stop_token stop, asio::any_io_executor executor)
      : signal_(std::make_shared<asio::cancellation_signal>()),
        callback_(std::move(stop), Emit{signal_, std::move(executor)}) {}
  StopCancellation(const StopCancellation&) = delete;
  StopCancellation& operator=(const StopCancellation&) = delete;

  /// asio::use_awaitable bound to this object's slot: the awaited operation is cancelled
  /// (terminal) when the stop token is stopped.
  auto use_awaitable() { return asio::bind_cancellation_slot(signal_->slot(), asio::use_awaitable); }

 private:
  struct Emit {
    std::shared_ptr<asio::cancellation_signal> signal;
    asio::any_io_executor executor;
    void operator()() noexcept {
      try {
        asio::post(executor, [signal = signal] { signal->emit(asio::cancellation_type::terminal); });
      } catch (...) {
        // No memory to queue it: the read runs to its end, and the stop is seen after it.
      }
    }
  };
  std::shared_ptr<asio::cancellation_signal> signal_;
  std::stop_callback<Emit> callback_;
};

}  // namespace eredu::detail
