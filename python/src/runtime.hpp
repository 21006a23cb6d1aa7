#pragma once
/// \file
/// eredu::python::Runtime: what the Python module runs eredu on, once per process — one Asio
/// event loop on a thread of its own, TBB's worker limit, the default tensor storage pool, and
/// the delivery thread that hands completions to Python.
///
/// One loop per process, not one per object: a CheckpointSource and everything built on it
/// (loads, pipelines, slots) wants a single-threaded executor, and the loop only submits reads
/// and resumes coroutines (TBB workers copy and convert), so a thread per open checkpoint would
/// cost threads for nothing. With one loop, "every call into eredu runs on the loop thread" is
/// an invariant of the module rather than a rule each binding must remember.
///
/// The loop thread never takes the GIL. A completion that must reach Python code (an asyncio
/// future, a canary) is queued to the delivery thread, which takes the GIL for it; a blocking
/// waiter is woken through a condition variable. So Python code may wait for the loop — even
/// with the GIL held — without deadlock, and a Python thread that computes never delays the
/// completion of a read.
///
/// Lifetime: started on first use; the delivery thread stops at interpreter exit (an `atexit`
/// hook, while the interpreter can still run it), the loop when the process's static objects
/// are destroyed. A process forked after the runtime started has no loop thread: get() refuses
/// there with a clear error (use the "spawn" start method).
///
/// Starting can fail where the system refuses a thread (RLIMIT_NPROC, RLIMIT_AS) or a descriptor
/// (RLIMIT_NOFILE: the loop's eventfd): get() then throws Error(resource_exhausted), or
/// Error(out_of_memory), having stopped whatever it had started, and the next get() tries again —
/// so a process whose limits are lifted can load after all.

// Python.h first: it sets feature macros the standard headers must see.
#include <Python.h>
#include <tbb/global_control.h>

#include <asio/any_io_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "eredu/core/unique_function.hpp"
#include "eredu/cpu/storage_pool.hpp"

namespace eredu::python {

/// The process-wide loop, delivery thread and storage pool (see file comment).
class Runtime {
 public:
  /// The runtime, started on first use (see file comment for its errors). Throws
  /// Error(backend_failure) in a forked child.
  static Runtime& get();
  /// The runtime if it has started in this process, else null: never starts it.
  static Runtime* if_started() noexcept;

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  /// Stops the loop and joins its thread (at static destruction).
  ~Runtime();

  /// The loop's executor: every CheckpointSource of the module is opened on it.
  asio::any_io_executor executor() { return context_.get_executor(); }
  /// True on the loop thread.
  bool on_loop_thread() const noexcept { return std::this_thread::get_id() == loop_id_; }

  /// Runs `fn` on the loop thread, later.
  void post(UniqueFunction<void()> fn);
  /// Runs `fn` on the loop thread and waits for it, with the GIL released if the caller holds
  /// it; inline when called on the loop thread. Rethrows what `fn` throws.
  void run_on_loop(UniqueFunction<void()> fn);

  /// Queues `fn` to run on the delivery thread with the GIL held. Dropped (and destroyed with
  /// the GIL held) once the interpreter has begun to exit.
  void deliver(UniqueFunction<void()> fn);
  /// Drops one reference to `object` on the delivery thread (PyHandle's destructor, on a
  /// thread without the GIL); leaks it once the interpreter has begun to exit.
  void defer_decref(PyObject* object);
  /// Stops the delivery thread: the `atexit` hook. Call with the GIL held.
  void stop_delivery();

  /// The storage pool of loads that have no pool of their own (safe_open, load_file, aload).
  cpu::StoragePool storage();
  /// Replaces the default pool with one that keeps `bytes` of freed storage for reuse; tensors
  /// already loaded keep their old pool.
  void set_retention(std::uint64_t bytes);

  /// Threads a load uses when the caller names none: the hardware's.
  static int default_threads() noexcept;

 private:
  Runtime();
  void deliver_loop();

  asio::io_context context_{1};
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  // The event loop thread only submits and resumes: TBB must start `threads` workers besides
  // it, as `eredu load` arranges (see cpu/executor.hpp).
  tbb::global_control workers_;
  std::mutex storage_mutex_;
  cpu::StoragePool storage_;
  std::thread loop_;
  std::thread::id loop_id_;
  pid_t pid_;

  std::mutex delivery_mutex_;
  std::condition_variable delivery_wakeup_;
  std::deque<UniqueFunction<void()>> deliveries_;
  std::vector<PyObject*> decrefs_;
  bool delivery_stopped_ = false;
  std::thread delivery_;  // last: started once everything above exists
};

}  // namespace eredu::python
