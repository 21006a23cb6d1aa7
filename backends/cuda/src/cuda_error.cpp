#include "eredu/cuda/cuda_error.hpp"

#include <fmt/format.h>

namespace eredu::cuda {

errc errc_for(cudaError_t status) noexcept {
  // cudaErrorMemoryAllocation is what cudaMalloc*, cudaMallocFromPoolAsync and
  // cudaMallocHost report when memory is exhausted.
  return status == cudaErrorMemoryAllocation ? errc::out_of_memory : errc::backend_failure;
}

BackendError cuda_error(cudaError_t status, const char* call, const std::string& tensor) {
  // cudaGetErrorName/String need no device and no initialised runtime; unknown values get
  // "unrecognized error code" from the runtime, which is still worth printing.
  const char* name = cudaGetErrorName(status);
  const char* text = cudaGetErrorString(status);
  return BackendError(errc_for(status), {.tensor = tensor},
                      fmt::format("{} failed: {} ({}, CUDA error {})", call, name ? name : "?", text ? text : "?",
                                  static_cast<int>(status)));
}

}  // namespace eredu::cuda
