#pragma once
/// \file
/// eredu::Completion: the one completion abstraction shared by the io layer and every
/// backend — "this asynchronous work has finished, successfully or with this error".
///
/// A producer (a TBB task, a CUDA event callback, an io_uring reap) holds the
/// CompletionSource and completes it exactly once; any number of consumers hold copies of
/// the Completion (copies are handles to the same event, like std::shared_future) and
///
///  * test it: `ready()`, `error()`;
///  * block on it: `wait()` (never from an event-loop thread: use async_wait there);
///  * `co_await c.async_wait(asio::use_awaitable)`, or pass a callback or asio::use_future.
///    The handler always runs on its own associated executor (a coroutine resumes on the
///    executor it was spawned on), never inline on the thread that completed the work —
///    so a TBB worker or a CUDA callback thread never runs a coroutine's continuation.
///
/// Completion is itself type-erased: a backend with a native completion (an event) wraps it
/// by completing a CompletionSource, so heterogeneous sets are plain vectors of Completion
/// and `when_all` combines them.

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/system_executor.hpp>
#include <exception>
#include <memory>
#include <span>
#include <string>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/unique_function.hpp"

namespace eredu {

namespace detail {
struct CompletionState;
}

/// Consumer handle of one asynchronous event (see file comment). Cheap to copy.
class Completion {
 public:
  /// An invalid handle (valid() is false); use CompletionSource or ready_now().
  Completion() noexcept = default;

  /// A completion that has already succeeded.
  static Completion ready_now();
  /// A completion that has already failed with `error`.
  static Completion failed(std::exception_ptr error);

  /// True when this handle refers to an event.
  bool valid() const noexcept { return state_ != nullptr; }
  /// True once the work has finished (successfully or not).
  bool ready() const noexcept;
  /// The failure, or nullptr while pending or after success.
  std::exception_ptr error() const noexcept;
  /// Blocks the calling thread until ready(). Do not call on a thread that must run the
  /// producer (an event loop thread or a TBB worker of the producing arena).
  void wait() const;
  /// wait(), then rethrows the failure if there was one.
  void get() const;

  /// Runs `fn(error)` once the work has finished: inline on the completing thread, or
  /// inline now if it already has. For short bookkeeping only (releasing retained values,
  /// chaining): never resume user code here; that is what async_wait is for. An exception
  /// `fn` throws on the completing thread is logged and dropped (completing cannot fail):
  /// a callback that can fail must report it through a completion of its own.
  void on_complete(UniqueFunction<void(std::exception_ptr)> fn) const;

  /// Waits asynchronously for the work to finish.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr)`: null on success, else the work's failure. The handler runs
  /// on its associated executor (asio::system_executor if it has none), never inline on the
  /// thread that completed the work.
  ///
  /// @par Per-Operation Cancellation
  /// none: the wait ends when the work does (cancel the work itself, through its producer).
  ///
  /// Nothing needs to outlive the operation: it holds a copy of this handle.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_wait(Token&& token) const {
    return asio::async_initiate<Token, void(std::exception_ptr)>(
        [](auto handler, Completion self) {
          self.on_complete(eredu::detail::deliver_on_handler_executor<std::exception_ptr>(std::move(handler),
                                                                                          asio::system_executor()));
        },
        token, *this);
  }

 private:
  friend class CompletionSource;
  explicit Completion(std::shared_ptr<detail::CompletionState> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<detail::CompletionState> state_;
};

/// Producer side of a Completion: completes it exactly once. Move-only. Destroying a source
/// that was never completed fails its completion with eredu::Error(cancelled), so a lost
/// producer can never leave a waiter hanging.
class CompletionSource {
 public:
  /// A new, pending event.
  CompletionSource();
  CompletionSource(CompletionSource&&) noexcept = default;
  CompletionSource& operator=(CompletionSource&& other) noexcept;
  CompletionSource(const CompletionSource&) = delete;
  CompletionSource& operator=(const CompletionSource&) = delete;
  ~CompletionSource();

  /// A consumer handle to this event.
  Completion completion() const noexcept { return Completion(state_); }
  /// Marks the work finished successfully; later calls are ignored.
  void complete() noexcept { finish(nullptr); }
  /// Marks the work failed with `error`; later calls are ignored.
  void fail(std::exception_ptr error) noexcept { finish(std::move(error)); }
  /// complete() when `error` is null, fail(error) otherwise.
  void finish(std::exception_ptr error) noexcept;

 private:
  std::shared_ptr<detail::CompletionState> state_;
};

/// `error` as a completion's failure: a std::bad_alloc becomes eredu::Error(out_of_memory)
/// (one built when the process started, when there is no memory to build another); any
/// other error is returned as it is. For the code that completes work on a thread where no
/// exception may escape (a TBB worker, a reader's thread).
std::exception_ptr typed_failure(std::exception_ptr error) noexcept;

/// eredu::Error(out_of_memory), built when the process started: what a failed allocation
/// is reported as where reporting must not allocate (a destructor, a worker thread).
std::exception_ptr out_of_memory_error() noexcept;

/// A completion that finishes when every one of `completions` has; its error is the first
/// failure in span order that is not eredu::errc::cancelled (the root cause, not the
/// cancellations it provoked), else the first failure. Empty input: ready at once.
Completion when_all(std::span<const Completion> completions);

}  // namespace eredu
