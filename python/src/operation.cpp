#include "operation.hpp"

#include <algorithm>
#include <asio/cancellation_type.hpp>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <utility>

#include "log_forwarding.hpp"
#include "runtime.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

// How often a blocked waiter takes the GIL to look for Ctrl-C: short enough that an
// interrupt feels immediate, long enough to cost nothing.
constexpr auto signal_poll = std::chrono::milliseconds(25);
// How often a progress callback is called at most: a display redrawn 20 times a second looks
// live, and a callback that does Python work costs the load nothing measurable.
constexpr auto progress_interval = std::chrono::milliseconds(50);

}  // namespace

std::shared_ptr<Operation> Operation::create(std::string what) {
  return std::make_shared<Operation>(Passkey{}, std::move(what));
}

void Operation::finish(std::exception_ptr error, ResultFactory result) noexcept {
  bool bound = false;
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
    result_ = std::move(result);
    bound = bound_;
  }
  changed_.notify_all();
  if (!bound) return;
  try {
    notify_loop(true);
  } catch (...) {
    // No memory to queue the delivery: a blocking waiter has seen done_ already; an asyncio one
    // is not told (nothing can run Python code for it without that memory).
  }
}

void Operation::run_in_python(UniqueFunction<void()> job) {
  bool bound = false;
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    bound = bound_;
  }
  changed_.notify_all();
  if (bound) notify_loop(false);
}

void Operation::notify_loop(bool finished) {
  Runtime::get().deliver([self = shared_from_this(), finished] {
    try {
      self->loop_.get().attr("call_soon_threadsafe")(finished ? self->on_done_.get() : self->on_jobs_.get());
    } catch (py::error_already_set& e) {
      // A closed loop has nobody left to await the operation: its result is dropped.
      if (!e.matches(PyExc_RuntimeError)) throw;
    }
    if (finished) {
      // The callbacks refer back to the operation's Python wrapper: dropping them here breaks
      // a cycle the garbage collector cannot see through C++.
      self->on_done_.reset();
      self->on_jobs_.reset();
      self->loop_.reset();
    }
  });
}

void Operation::bind(const py::object& loop, const py::object& on_done, const py::object& on_jobs) {
  bool finished = false;
  bool jobs = false;
  {
    std::lock_guard lock(mutex_);
    if (bound_) throw std::logic_error("an eredu operation can be awaited only once");
    loop_ = PyHandle(loop);
    on_done_ = PyHandle(on_done);
    on_jobs_ = PyHandle(on_jobs);
    bound_ = true;
    finished = done_;
    jobs = !jobs_.empty();
  }
  if (jobs) notify_loop(false);
  if (finished) notify_loop(true);
}

void Operation::run_jobs() {
  for (;;) {
    UniqueFunction<void()> job;
    {
      std::lock_guard lock(mutex_);
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void Operation::cancel() {
  {
    std::lock_guard lock(mutex_);
    if (done_ || cancel_requested_) return;
    cancel_requested_ = true;
  }
  Runtime::get().post([self = shared_from_this()] { self->signal_.emit(asio::cancellation_type::terminal); });
}

bool Operation::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

std::pair<std::uint64_t, std::uint64_t> Operation::bytes() const noexcept {
  // Total first: it is set before any byte is counted, so done never passes it.
  const std::uint64_t total = progress_.bytes_total.load(std::memory_order_acquire);
  const std::uint64_t done = progress_.bytes_done.load(std::memory_order_acquire);
  return {std::min(done, total), total};
}

py::object Operation::wait(const py::object& on_progress) {
  using clock = std::chrono::steady_clock;
  std::optional<py::error_already_set> interrupted;
  const bool reporting = !on_progress.is_none();
  clock::time_point last_report = clock::now();
  std::uint64_t reported = 0;
  // Calls the callback on this thread, GIL held; what it raises cancels the operation and is
  // raised once it has stopped, as Ctrl-C is.
  auto report = [&](std::uint64_t done, std::uint64_t total) {
    reported = done;
    last_report = clock::now();
    try {
      on_progress(done, total, "read");
    } catch (py::error_already_set& e) {
      interrupted.emplace(std::move(e));
      cancel();
    }
  };
  for (;;) {
    bool finished = false;
    bool jobs = false;
    {
      py::gil_scoped_release nogil;
      std::unique_lock lock(mutex_);
      changed_.wait_for(lock, signal_poll, [this] { return done_ || !jobs_.empty(); });
      finished = done_;
      jobs = !jobs_.empty();
    }
    drain_log_records();  // lines eredu's threads logged meanwhile reach `logging` now
    if (jobs) run_jobs();
    if (finished) {
      run_jobs();  // a job queued just before the end still runs (and so completes its waiter)
      break;
    }
    if (!interrupted && PyErr_CheckSignals() != 0) {
      // Ctrl-C: stop the operation, then wait for it to finish before raising, so no lease is
      // held and nothing still writes into memory the caller may free.
      interrupted.emplace();
      cancel();
    }
    if (reporting && !interrupted && clock::now() - last_report >= progress_interval) {
      const auto [done, total] = bytes();
      if (total != 0 && (done != reported || reported == 0)) report(done, total);
    }
  }
  if (interrupted) throw *interrupted;
  if (reporting) {
    bool failed = false;
    {
      std::lock_guard lock(mutex_);
      failed = error_ != nullptr;
    }
    // The last call says the bytes are all there: done == total, whatever the last poll saw.
    if (!failed) {
      const std::uint64_t total = bytes().second;
      on_progress(total, total, "read");
    }
  }
  return result();
}

py::object Operation::result() {
  std::exception_ptr error;
  ResultFactory factory;
  {
    std::lock_guard lock(mutex_);
    if (!done_) throw std::logic_error(what_ + ": the result was asked for before the operation finished");
    if (result_taken_) throw std::logic_error(what_ + ": the result was already taken");
    result_taken_ = true;
    error = error_;
    factory = std::move(result_);
  }
  if (error) std::rethrow_exception(error);
  if (!factory) return py::none();
  return factory();
}

}  // namespace eredu::python
