#include "eredu/nccl/published_tensor.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"

namespace eredu::nccl {

mpi::PublishedTensor published_tensor(std::string name, cuda::Tensor tensor) {
  if (!tensor)
    throw Error(errc::invalid_argument, {.tensor = name}, "an empty device tensor handle cannot be published");
  mpi::PublishedTensor out{.name = name, .dtype = tensor.dtype(), .shape = tensor.shape()};
  // The handle travels with the copier: the device memory lives as long as the publication.
  out.copy_out = [name = std::move(name), tensor = std::move(tensor)](std::uint64_t offset, std::span<std::byte> to) {
    if (offset > tensor.nbytes() || to.size() > tensor.nbytes() - offset)
      throw Error(
          errc::invalid_argument, {.tensor = name, .offset = offset},
          fmt::format("a copy of {} bytes past the end of a {}-byte device tensor", to.size(), tensor.nbytes()));
    if (to.empty()) return;
    const cuda::DeviceGuard on(tensor.device());
    cuda::check(cudaMemcpy(to.data(), tensor.data() + offset, to.size(), cudaMemcpyDeviceToHost), "cudaMemcpy", name);
  };
  return out;
}

}  // namespace eredu::nccl
