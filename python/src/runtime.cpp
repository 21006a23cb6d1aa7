#include "runtime.hpp"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <asio/post.hpp>
#include <exception>
#include <future>
#include <stdexcept>
#include <vector>

#include <unistd.h>

namespace eredu::python {

namespace py = pybind11;

namespace {

// Freed tensor storage goes back to the system at once by default: a Python user who drops a
// state dict expects the memory back. set_retention() trades that for faster repeated loads.
cpu::StoragePool make_pool(std::uint64_t retained) {
  return cpu::StoragePool(cpu::StoragePoolOptions{.max_retained_bytes = retained});
}

}  // namespace

int Runtime::default_threads() noexcept { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

Runtime& Runtime::get() {
  static Runtime runtime;
  if (runtime.pid_ != ::getpid())
    throw std::runtime_error(
        "eredu was started in the parent of this forked process, and its event loop thread does not exist here: "
        "use eredu in processes started with the 'spawn' or 'forkserver' method");
  return runtime;
}

Runtime::Runtime()
    : work_(asio::make_work_guard(context_)),
      workers_(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(default_threads()) + 1),
      storage_(make_pool(0)),
      pid_(::getpid()) {
  std::promise<std::thread::id> started;
  std::future<std::thread::id> id = started.get_future();
  loop_ = std::thread([this, &started] {
    started.set_value(std::this_thread::get_id());
    // Handlers report their own errors; one that escapes must not end the loop of the whole
    // process, so it is dropped here and the loop goes on.
    for (;;) {
      try {
        context_.run();
        return;
      } catch (...) {}
    }
  });
  loop_id_ = id.get();
  delivery_ = std::thread([this] { deliver_loop(); });
}

Runtime::~Runtime() {
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
