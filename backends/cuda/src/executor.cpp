#include "eredu/cuda/executor.hpp"

#include <algorithm>
#include <mutex>

#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/event.hpp"
#include "eredu/cuda/stream_completion.hpp"

namespace eredu::cuda {

/// What held ops share with the executor.
struct Executor::State {
  std::mutex mutex;
  std::vector<Completion> predecessors;  // from order_after(Completion)
  Completion issued;                     // the last held op has been queued (or failed)
};

namespace {

/// Queues `op` and returns the completion of its work; an exception becomes a failed completion.
Completion issue(const std::shared_ptr<const Stream>& stream, UniqueFunction<void(cudaStream_t)>& op,
                 const std::string& what) {
  try {
    op(stream->get());
  } catch (...) {
    return Completion::failed(std::current_exception());
  }
  return stream_completion(stream->get(), what);
}

}  // namespace

Executor::Executor(int device)
    : device_(device), stream_(std::make_shared<const Stream>(device)), state_(std::make_shared<State>()) {}

Executor::~Executor() = default;

Completion Executor::enqueue(UniqueFunction<void(cudaStream_t)> op, const std::string& what) {
  Completion gate;
  CompletionSource issued;
  {
    std::lock_guard lock(state_->mutex);
    // Succeeded predecessors no longer hold anything back; failed ones stay, so that later
    // work keeps failing rather than running on inputs that were never produced.
    std::erase_if(state_->predecessors, [](const Completion& c) { return c.ready() && !c.error(); });
    std::vector<Completion> waits = state_->predecessors;
    if (state_->issued.valid() && !state_->issued.ready()) waits.push_back(state_->issued);
    if (waits.empty()) {
      // Issued under the lock: an op held later cannot overtake this one.
      return issue(stream_, op, what);
    }
    gate = when_all(waits);
    state_->issued = issued.completion();
  }
  CompletionSource done;
  Completion result = done.completion();
  gate.on_complete([stream = stream_, op = std::move(op), what, issued = std::move(issued),
                    done = std::move(done)](std::exception_ptr error) mutable {
    if (error) {
      done.fail(error);
    } else {
      Completion work = issue(stream, op, what);
      work.on_complete([done = std::move(done)](std::exception_ptr e) mutable { done.finish(std::move(e)); });
    }
    issued.complete();  // the next held op may go now: its work is queued after this one's
  });
  return result;
}

void Executor::order_after(const Completion& completion) {
  if (completion.ready() && !completion.error()) return;
  std::lock_guard lock(state_->mutex);
  state_->predecessors.push_back(completion);
}

void Executor::order_after(Executor& other) {
  auto event = std::make_shared<Event>(other.device());
  bool recorded = false;
  {
    std::lock_guard lock(other.state_->mutex);
    const bool held = std::any_of(other.state_->predecessors.begin(), other.state_->predecessors.end(),
                                  [](const Completion& c) { return !c.ready() || c.error(); }) ||
                      (other.state_->issued.valid() && !other.state_->issued.ready());
    if (!held) {
      event->record(other.stream());
      recorded = true;
    }
  }
  if (!recorded) {
    // `other` still holds ops on the host: an event recorded now would not cover them, and
    // one recorded later could be waited on before it exists. Order on the host instead.
    order_after(other.fence());
    return;
  }
  // The event outlives the wait's queueing; CUDA keeps what the wait needs after that.
  Completion wait = enqueue([event](cudaStream_t s) { event->make_wait(s); });
  // A wait that could not be queued must hold back what follows, as a failed predecessor does.
  if (wait.ready() && wait.error()) order_after(wait);
}

std::vector<std::unique_ptr<Executor>> Executor::fork(std::size_t count) const {
  std::vector<std::unique_ptr<Executor>> lanes;
  lanes.reserve(count);
  for (std::size_t i = 0; i < count; ++i) lanes.push_back(std::make_unique<Executor>(device_));
  return lanes;
}

}  // namespace eredu::cuda
