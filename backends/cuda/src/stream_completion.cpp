#include "eredu/cuda/stream_completion.hpp"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "eredu/cuda/cuda_error.hpp"

namespace eredu::cuda {
namespace {

/// One completion on its way from a stream callback to the relay thread.
struct Pending {
  CompletionSource source;
  cudaError_t status = cudaSuccess;
  std::string what;
};

/// The thread that completes sources handed over by stream callbacks (see the header for
/// why). One per process, started on first use; its destructor (at exit) completes what
/// is queued and joins.
class Relay {
 public:
  Relay() : thread_([this] { run(); }) {}
  ~Relay() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  void push(std::unique_ptr<Pending> p) noexcept {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(p));
    }
    wake_.notify_one();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::unique_ptr<Pending> p = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      finish(*p);
      p.reset();  // whatever the completion's handlers left in Pending goes here, off the lock
      lock.lock();
    }
  }

  static void finish(Pending& p) noexcept {
    if (p.status == cudaSuccess) {
      p.source.complete();
      return;
    }
    std::exception_ptr error;
    try {
      error = std::make_exception_ptr(cuda_error(p.status, "stream work", p.what));
    } catch (...) {
      error = std::current_exception();  // bad_alloc building the message
    }
    p.source.fail(std::move(error));
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Pending>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

Relay& relay() {
  static Relay instance;
  return instance;
}

/// The stream callback: no CUDA call, no allocation, no lock held for long.
void CUDART_CB on_stream_done(cudaStream_t, cudaError_t status, void* data) {
  std::unique_ptr<Pending> p(static_cast<Pending*>(data));
  p->status = status;
  relay().push(std::move(p));
}

}  // namespace

Completion stream_completion(cudaStream_t stream, const std::string& what) {
  relay();  // started here, not inside a CUDA callback
  auto p = std::make_unique<Pending>();
  p->what = what;
  Completion done = p->source.completion();
  const cudaError_t status = cudaStreamAddCallback(stream, on_stream_done, p.get(), 0);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    // The completion must not fire before the work it stands for has finished: whatever it
    // retains (a lease under a running copy) would be reused too early. On this error path
    // only, wait for the stream; its own error, if any, is the one worth reporting.
    const cudaError_t drained = cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    p->source.fail(std::make_exception_ptr(
        cuda_error(drained != cudaSuccess ? drained : status,
                   drained != cudaSuccess ? "cudaStreamSynchronize" : "cudaStreamAddCallback", what)));
    return done;
  }
  (void)p.release();  // owned by the callback from here
  return done;
}

namespace detail {

void relay_completion(CompletionSource source, cudaError_t status, std::string what) noexcept {
  std::unique_ptr<Pending> p;
  try {
    p = std::make_unique<Pending>();
  } catch (...) {
    source.fail(std::current_exception());
    return;
  }
  p->source = std::move(source);
  p->status = status;
  p->what = std::move(what);
  relay().push(std::move(p));
}

}  // namespace detail
}  // namespace eredu::cuda
