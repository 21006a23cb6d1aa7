#include "eredu/cuda/stream.hpp"

#include <utility>

#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"

namespace eredu::cuda {

Stream::Stream(int device) : device_(device) {
  DeviceGuard guard(device);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(std::exchange(other.device_, -1)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_) (void)cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

Stream::~Stream() {
  // Swallowed: the only failures are a vanished device or a runtime already shut down.
  if (stream_) (void)cudaStreamDestroy(stream_);
}

}  // namespace eredu::cuda
