#include "eredu/cuda/device.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "eredu/cuda/cuda_error.hpp"

namespace eredu::cuda {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorName(status), cudaGetErrorString(status));
  }
  return n == 0 ? "cudaGetDeviceCount: 0 devices" : "";
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  // Restoring can only fail if the device vanished; nothing useful to do about it here.
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

}  // namespace eredu::cuda
