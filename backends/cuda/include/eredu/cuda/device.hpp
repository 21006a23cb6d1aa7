#pragma once
/// \file
/// Devices: whether any CUDA device can be used here (tests and benchmarks skip when none
/// can), and a guard that makes a device current for a scope.

#include <string>

namespace eredu::cuda {

/// Number of usable CUDA devices; 0 when the runtime reports none or fails to initialise
/// (no driver, driver too old, no device). Never throws.
int device_count() noexcept;

/// Why no device is usable ("cudaGetDeviceCount: cudaErrorNoDevice (...)"), or "" when one is.
std::string no_device_reason();

/// Makes `device` current for the guard's scope and restores the previous one after.
/// Throws BackendError when the device cannot be selected.
class DeviceGuard {
 public:
  /// Selects `device` (cudaSetDevice) if it is not already current.
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace eredu::cuda
