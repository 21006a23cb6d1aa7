#include "eredu/cuda/host_buffer.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "eredu/cuda/cuda_error.hpp"

namespace eredu::cuda {

PinnedBlock::PinnedBlock(std::size_t bytes) : size_(bytes) {
  void* p = nullptr;
  const cudaError_t status = cudaMallocHost(&p, bytes ? bytes : 1);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    BackendError e = cuda_error(status, "cudaMallocHost");
    throw BackendError(e.kind(), e.context(), fmt::format("{} pinned host bytes: {}", bytes, e.detail()));
  }
  data_ = static_cast<std::byte*>(p);
}

PinnedBlock::~PinnedBlock() {
  // Swallowed: a destructor cannot report; cudaFreeHost only fails on a broken runtime.
  if (data_) (void)cudaFreeHost(data_);
}

}  // namespace eredu::cuda
