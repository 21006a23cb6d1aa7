#pragma once
/// \file
/// eredu::cuda::Executor: a CUDA stream as a backend executor (SubmissionBackend).
///
/// Work is queued on the stream by `enqueue(op)`; its end is an eredu::Completion (see
/// stream_completion.hpp: a stream callback relayed to a backend thread), which a coroutine
/// co_awaits and resumes on its own Asio executor.
///
/// Ordering after an arbitrary Completion (`order_after(Completion)`): the engine's
/// Completion is type-erased and carries no CUDA event, so the stream cannot wait for it on
/// the device. Instead the executor holds the ops enqueued after it on the host, and queues
/// them — in their original order — once every predecessor has completed (from the thread
/// that completed the last one: the relay for CUDA work, a TBB worker, the event loop). No
/// thread blocks meanwhile. Between two executors, `order_after(Executor&)` is the device-side
/// ordering: an event recorded on the other stream and cudaStreamWaitEvent on this one.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/retain_until_complete.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/cuda/stream.hpp"

namespace eredu::cuda {

/// A stream that runs queued work and reports it as Completions (see file comment). Not
/// movable (held work refers to its state); own it through std::unique_ptr to pass it
/// around. Thread-safe. The stream itself is shared with the device memory it allocated
/// (blocks are freed on it), so it lives until the last of those is freed; destroying the
/// executor does not wait for its work, which still completes.
class Executor {
 public:
  /// A new non-blocking stream on `device`. Throws BackendError (no device, bad index).
  explicit Executor(int device = 0);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// The device the stream belongs to.
  int device() const noexcept { return device_; }
  /// The native stream.
  cudaStream_t stream() const noexcept { return stream_->get(); }
  /// Shared ownership of the stream (device allocations keep their home stream alive).
  const std::shared_ptr<const Stream>& shared_stream() const noexcept { return stream_; }

  /// Runs `op(stream)`, which queues work on the stream, now — or, when order_after left
  /// predecessors pending, once they have completed, after every op held before it. Returns
  /// the completion of the work `op` queued (and everything before it on the stream). An
  /// exception thrown by `op`, a failed predecessor, or a device error fails that
  /// completion; `what` names the work in the error (a tensor). Never throws.
  Completion enqueue(UniqueFunction<void(cudaStream_t)> op, const std::string& what = {});

  /// A completion for everything enqueued so far (the seed's submit).
  Completion fence() {
    return enqueue([](cudaStream_t) {});
  }

  /// Ops enqueued from now on run after `completion` (host-side, see file comment). A failed
  /// predecessor fails them: nothing runs on inputs that were not produced.
  void order_after(const Completion& completion);

  /// Work queued from now on waits, on the device, for everything already queued on
  /// `other` (cudaEventRecord + cudaStreamWaitEvent). Throws BackendError.
  void order_after(Executor& other);

  /// Keeps `value` alive until `completion` has finished, then destroys it on the thread
  /// that completed it (never a CUDA callback thread, so `value` may free CUDA memory;
  /// eredu::retain_until_complete, the one definition).
  template <class T>
  static void retain_until_complete(const Completion& completion, T value) {
    eredu::retain_until_complete(completion, std::move(value));
  }

  /// `count` new executors (streams) on the same device, for independently ordered lanes.
  std::vector<std::unique_ptr<Executor>> fork(std::size_t count) const;

 private:
  struct State;
  int device_;
  std::shared_ptr<const Stream> stream_;
  std::shared_ptr<State> state_;  // shared with held ops
};

}  // namespace eredu::cuda
