#pragma once
/// \file
/// The one place CUDA runtime errors become eredu errors: every CUDA call of the backend is
/// checked with `check(status, "cudaMemcpyAsync", tensor)`, which throws an
/// eredu::BackendError whose message names the call, the cudaError name and text, and the
/// tensor concerned. Out-of-memory statuses map to errc::out_of_memory (so a unit that runs
/// out of device memory reports it as such), everything else to errc::backend_failure.

#include <cuda_runtime_api.h>

#include <string>

#include "eredu/core/errc.hpp"
#include "eredu/core/error.hpp"

namespace eredu::cuda {

/// The error kind a CUDA status maps to: out_of_memory for allocation failures
/// (cudaErrorMemoryAllocation), backend_failure otherwise.
errc errc_for(cudaError_t status) noexcept;

/// The BackendError for a failed `call` ("cudaMallocFromPoolAsync"), naming the status as
/// "<call> failed: <cudaErrorName> (<text>)" and `tensor` in the context when known.
BackendError cuda_error(cudaError_t status, const char* call, const std::string& tensor = {});

/// Throws cuda_error(status, call, tensor) unless status is cudaSuccess. Also clears the
/// thread's last-error state so that a handled failure does not reappear in a later call.
inline void check(cudaError_t status, const char* call, const std::string& tensor = {}) {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw cuda_error(status, call, tensor);
  }
}

}  // namespace eredu::cuda
