#include "runtime.hpp"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <asio/post.hpp>
#include <atomic>
#include <cstdio>
#include <exception>
#include <future>
#include <new>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "eredu/core/error.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

// Freed tensor storage goes back to the system at once by default: a Python user who drops a
// state dict expects the memory back. set_retention() trades that for faster repeated loads.
cpu::StoragePool make_pool(std::uint64_t retained) {
  return cpu::StoragePool(cpu::StoragePoolOptions{.max_retained_bytes = retained});
}

std::atomic<Runtime*> started{nullptr};

/// Starts a thread running `fn`, or throws Error(resource_exhausted) naming `which` when the
/// system refuses it (std::thread's std::system_error: EAGAIN under RLIMIT_NPROC, or for want
/// of address space for its stack).
template <class Fn>
std::thread start_thread(const char* which, Fn&& fn) {
  try {
    return std::thread(std::forward<Fn>(fn));
  } catch (const std::system_error& e) {
    throw Error(errc::resource_exhausted, {.os_error = e.code()},
                fmt::format("eredu could not start its {} thread", which));
  }
}

}  // namespace

int Runtime::default_threads() noexcept { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

Runtime& Runtime::get() {
  Runtime* runtime = nullptr;
  try {
    // A constructor that throws leaves the static unconstructed: the next call tries again.
    static Runtime instance;
    runtime = &instance;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(errc::out_of_memory, {}, "eredu could not start its event loop: out of memory");
  } catch (const std::system_error& e) {
    // Asio's io_context: an eventfd or epoll descriptor the file table refused (RLIMIT_NOFILE).
    throw Error(errc::resource_exhausted, {.os_error = e.code()}, "eredu could not start its event loop");
  }
  if (runtime->pid_ != ::getpid())
    throw Error(errc::backend_failure, {},
                "eredu was started in the parent of this forked process, and its event loop thread does not exist "
                "here: use eredu in processes started with the 'spawn' or 'forkserver' method");
  return *runtime;
}

Runtime* Runtime::if_started() noexcept {
  Runtime* runtime = started.load(std::memory_order_acquire);
  return runtime && runtime->pid_ == ::getpid() ? runtime : nullptr;  // a forked child's has no threads
}

Runtime::Runtime()
    : work_(asio::make_work_guard(context_)),
      workers_(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(default_threads()) + 1),
      storage_(make_pool(0)),
      pid_(::getpid()) {
  std::promise<std::thread::id> running;
  std::future<std::thread::id> id = running.get_future();
  loop_ = start_thread("event loop", [this, &running] {
    running.set_value(std::this_thread::get_id());
    // Handlers report their own errors (Operation::settle); one that escapes must not end the
    // loop of the whole process, so it is dropped here, said on stderr (whatever waited for it
    // may now wait for ever), and the loop goes on.
    for (;;) {
      try {
        context_.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "eredu: an exception escaped the event loop and was dropped: %s\n", e.what());
      } catch (...) {
        std::fputs("eredu: an exception escaped the event loop and was dropped\n", stderr);
      }
    }
  });
  loop_id_ = id.get();
  try {
    delivery_ = start_thread("delivery", [this] { deliver_loop(); });
  } catch (...) {
    // No half-started runtime: a joinable std::thread destroyed unjoined would terminate the
    // process, and the next get() starts both threads afresh.
    work_.reset();
    context_.stop();
    loop_.join();
    throw;
  }
  started.store(this, std::memory_order_release);
}

Runtime::~Runtime() {
  started.store(nullptr, std::memory_order_release);
  {
    std::lock_guard lock(delivery_mutex_);
    delivery_stopped_ = true;
  }
  delivery_wakeup_.notify_all();
  if (delivery_.joinable()) delivery_.join();
  // Python has finalized by now: what is still queued is dropped unrun (the Python references
  // it holds are leaked by PyHandle, which cannot take the GIL any more).
  deliveries_.clear();
  work_.reset();
  context_.stop();
  if (loop_.joinable()) loop_.join();
}

void Runtime::post(UniqueFunction<void()> fn) { asio::post(context_, std::move(fn)); }

void Runtime::run_on_loop(UniqueFunction<void()> fn) {
  if (on_loop_thread() || context_.stopped()) {
    fn();
    return;
  }
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  post([&fn, &done] {
    try {
      fn();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  if (PyGILState_Check()) {
    py::gil_scoped_release nogil;
    finished.wait();
  } else {
    finished.wait();
  }
  finished.get();
}

void Runtime::deliver(UniqueFunction<void()> fn) {
  {
    std::lock_guard lock(delivery_mutex_);
    if (!delivery_stopped_) {
      deliveries_.push_back(std::move(fn));
      delivery_wakeup_.notify_one();
      return;
    }
  }
  // The interpreter is exiting: nothing can run Python code for us any more. `fn` is dropped
  // unrun here (the PyHandles it holds decref inline with the GIL, or leak without it).
}

void Runtime::defer_decref(PyObject* object) {
  std::lock_guard lock(delivery_mutex_);
  if (delivery_stopped_) return;  // leaked on purpose: no thread may take the GIL any more
  decrefs_.push_back(object);
  delivery_wakeup_.notify_one();
}

void Runtime::deliver_loop() {
  for (;;) {
    std::deque<UniqueFunction<void()>> batch;
    std::vector<PyObject*> decrefs;
    {
      std::unique_lock lock(delivery_mutex_);
      delivery_wakeup_.wait(lock, [this] { return delivery_stopped_ || !deliveries_.empty() || !decrefs_.empty(); });
      if (delivery_stopped_) return;
      batch.swap(deliveries_);
      decrefs.swap(decrefs_);
    }
    py::gil_scoped_acquire gil;
    for (PyObject* object : decrefs) Py_DECREF(object);
    decrefs.clear();
    for (auto& fn : batch) {
      try {
        fn();
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("eredu: delivering a completion to Python");
      } catch (...) {}
    }
    batch.clear();  // destroys what the deliveries held, with the GIL
  }
}

void Runtime::stop_delivery() {
  {
    std::lock_guard lock(delivery_mutex_);
    if (delivery_stopped_) return;
    delivery_stopped_ = true;
  }
  delivery_wakeup_.notify_all();
  {
    py::gil_scoped_release nogil;  // the delivery thread may be waiting for the GIL
    if (delivery_.joinable()) delivery_.join();
  }
  std::deque<UniqueFunction<void()>> left;
  std::vector<PyObject*> decrefs;
  {
    std::lock_guard lock(delivery_mutex_);
    left.swap(deliveries_);
    decrefs.swap(decrefs_);
  }
  for (PyObject* object : decrefs) Py_DECREF(object);
  left.clear();  // with the GIL held, as the caller holds it
}

cpu::StoragePool Runtime::storage() {
  std::lock_guard lock(storage_mutex_);
  return storage_;
}

void Runtime::set_retention(std::uint64_t bytes) {
  std::lock_guard lock(storage_mutex_);
  storage_ = make_pool(bytes);
}

}  // namespace eredu::python
