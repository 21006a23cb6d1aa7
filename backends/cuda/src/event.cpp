#include "eredu/cuda/event.hpp"

#include <utility>

#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"

namespace eredu::cuda {

Event::Event(int device) {
  DeviceGuard guard(device);
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_) (void)cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  // Swallowed: a destructor cannot report, and CUDA defers the release past pending waits.
  if (event_) (void)cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) { check(cudaEventRecord(event_, stream), "cudaEventRecord"); }

void Event::make_wait(cudaStream_t stream) const {
  check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaEventQuery");
  return true;
}

}  // namespace eredu::cuda
