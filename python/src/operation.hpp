#pragma once
/// \file
/// eredu::python::Operation: one eredu asynchronous operation as Python sees it — started on
/// the loop thread, finished there with an exception_ptr and a result, consumed by Python in
/// one of two ways:
///
///  * wait(): the calling thread blocks with the GIL released, waking every 25 ms to take the
///    GIL and run PyErr_CheckSignals. A KeyboardInterrupt (or any exception a signal handler
///    raises) cancels the operation, waits until it has finished — every lease returned, no
///    read or conversion still writing — and is then raised.
///  * bind(loop, on_done, on_jobs): asyncio. On completion the delivery thread calls
///    `loop.call_soon_threadsafe(on_done)`, and on_done (eredu/_bridge.py) calls result() and
///    settles an asyncio future. Cancelling the awaiting task calls cancel(); the glue then
///    keeps awaiting the same operation until it has finished, and raises CancelledError.
///
/// cancel() emits terminal cancellation on the operation's cancellation slot, on the loop
/// thread (Asio's slots are not thread-safe), so every eredu operation stops the way its own
/// "Per-Operation Cancellation" documents and fails with errc::cancelled.
///
/// An operation may also ask for Python code to run while it is in flight (a hot-swap's
/// canary): run_in_python() queues a job that runs on the consumer's thread — the blocked
/// waiter, or the asyncio loop — with the GIL held.
///
/// Progress: a load feeds progress() (engine::MaterializeProgress: bytes_total set when the
/// load starts, bytes_done as each tensor lands) from eredu's threads; wait(on_progress) calls
/// `on_progress(done, total, "read")` from the waiting thread at most every 50 ms while the
/// bytes move, and once more with done == total when the load succeeds. An exception the
/// callback raises is handled like Ctrl-C: the operation is cancelled, awaited to its end, and
/// the callback's exception is raised. The asyncio glue reads bytes() itself (_bridge.py).

#include <pybind11/pybind11.h>

#include <asio/cancellation_signal.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "eredu/core/unique_function.hpp"
#include "eredu/engine/orchestration/materialize_options.hpp"
#include "py_handle.hpp"

namespace eredu::python {

/// See file comment. Shared between the loop (producer) and Python (consumer); create with
/// Operation::create.
class Operation : public std::enable_shared_from_this<Operation> {
 public:
  /// Builds the Python result from what the operation produced; runs once, with the GIL held.
  using ResultFactory = UniqueFunction<pybind11::object()>;

  /// A new, unfinished operation; `what` names it in messages ("load of model.safetensors").
  static std::shared_ptr<Operation> create(std::string what);

 private:
  struct Passkey {};  // only create() constructs, always into a shared_ptr

 public:
  /// Use create().
  Operation(Passkey, std::string what) : what_(std::move(what)) {}

  // --- producer side: the loop thread ---

  /// The slot to bind to the eredu operation's token (asio::bind_cancellation_slot). Loop only.
  asio::cancellation_slot cancellation_slot() { return signal_.slot(); }
  /// Finishes the operation: failed when `error` is set, else with `result`. Once; any thread.
  void finish(std::exception_ptr error, ResultFactory result = {}) noexcept;
  /// Runs `body` (the loop-thread part of the operation: what a posted task or a completion
  /// handler does); what it throws finishes the operation failed instead of escaping. An
  /// exception that escaped into the loop would be dropped there, and the operation would never
  /// finish — its waiter would hang; one that escaped into a library's noexcept completion would
  /// end the process. A std::bad_alloc where memory is short is the usual one.
  template <class Body>
  void settle(Body&& body) noexcept {
    try {
      body();
    } catch (...) {
      finish(std::current_exception());
    }
  }
  /// Queues `job` to run on the consumer's thread with the GIL held (see file comment). A job
  /// that never runs is destroyed instead, so what it holds must say so when dropped.
  void run_in_python(UniqueFunction<void()> job);

  // --- consumer side: Python, GIL held ---

  /// Blocks until finished (see file comment); returns result() or raises. `on_progress`
  /// (None or a callable) is called as the file comment says.
  pybind11::object wait(const pybind11::object& on_progress = pybind11::none());
  /// Delivers completion (and jobs) to an asyncio loop: `on_done()` and `on_jobs()` are called
  /// through `loop.call_soon_threadsafe`. Once.
  void bind(const pybind11::object& loop, const pybind11::object& on_done, const pybind11::object& on_jobs);
  /// Runs the queued jobs now (asyncio: on_jobs calls it).
  void run_jobs();
  /// Asks the operation to stop (terminal cancellation, on the loop thread). Idempotent;
  /// harmless once finished.
  void cancel();
  /// True once finished.
  bool done() const;
  /// The result, or raises the operation's error as an eredu exception. Call once finished;
  /// the result can be taken once.
  pybind11::object result();
  /// The counters a load updates (engine::MaterializeOptions::progress); they live as long as
  /// the operation, so a load's handler that holds the operation may hand them to the engine.
  engine::MaterializeProgress& progress() noexcept { return progress_; }
  /// (bytes done, bytes total) of progress(), done never above total; (0, 0) before the load
  /// has planned its bytes. Any thread.
  std::pair<std::uint64_t, std::uint64_t> bytes() const noexcept;
  /// What the operation is, for messages.
  const std::string& what() const noexcept { return what_; }

 private:
  void notify_loop(bool finished);

  std::string what_;
  asio::cancellation_signal signal_;  // emitted on the loop thread only
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;
  bool cancel_requested_ = false;
  bool result_taken_ = false;
  std::exception_ptr error_;
  ResultFactory result_;
  std::deque<UniqueFunction<void()>> jobs_;
  bool bound_ = false;
  PyHandle loop_, on_done_, on_jobs_;
  engine::MaterializeProgress progress_;
};

}  // namespace eredu::python
