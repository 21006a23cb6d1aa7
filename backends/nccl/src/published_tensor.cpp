#include "eredu/nccl/published_tensor.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"

namespace eredu::nccl {

mpi::PublishedTensor published_tensor(std::string name, cuda::Tensor tensor) {
  if (!tensor)
    throw Error(errc::invalid_argument, {.tensor = name}, "an empty device tensor handle cannot be published");
  mpi::PublishedTensor out{.name = name, .dtype = tensor.dtype(), .shape = tensor.shape()};
  // The handle travels with the copier: the device memory lives as long as the publication.
  out.copy_out = [name = std::move(name), tensor = std::move(tensor)](std::span<const ByteRun> runs,
                                                                      std::span<std::byte> to) {
    for (const ByteRun& r : runs)
      if (r.source_offset > tensor.nbytes() || r.length > tensor.nbytes() - r.source_offset ||
          r.dest_offset > to.size() || r.length > to.size() - r.dest_offset)
        throw Error(errc::invalid_argument, {.tensor = name, .offset = r.source_offset},
                    fmt::format("a copy of {} bytes past the end of a {}-byte device tensor or of its {}-byte "
                                "destination",
                                r.length, tensor.nbytes(), to.size()));
    if (runs.empty()) return;
    const cuda::DeviceGuard on(tensor.device());
    // Runs of one length at one stride, packed (a column shard's rows): one strided copy each,
    // where a copy per run would wait on the device once per row.
    for (std::size_t i = 0; i < runs.size();) {
      const ByteRun& first = runs[i];
      std::size_t j = i + 1;
      const std::uint64_t pitch = j < runs.size() && runs[j].source_offset > first.source_offset
                                      ? runs[j].source_offset - first.source_offset
                                      : 0;
      if (pitch >= first.length && pitch <= (std::uint64_t{1} << 30))
        while (j < runs.size() && runs[j].length == first.length &&
               runs[j].source_offset == runs[j - 1].source_offset + pitch &&
               runs[j].dest_offset == runs[j - 1].dest_offset + first.length)
          ++j;
      if (j - i > 1)
        cuda::check(cudaMemcpy2D(to.data() + first.dest_offset, first.length, tensor.data() + first.source_offset,
                                 pitch, first.length, j - i, cudaMemcpyDeviceToHost),
                    "cudaMemcpy2D", name);
      else
        cuda::check(cudaMemcpy(to.data() + first.dest_offset, tensor.data() + first.source_offset, first.length,
                               cudaMemcpyDeviceToHost),
                    "cudaMemcpy", name);
      i = j;
    }
  };
  return out;
}

}  // namespace eredu::nccl
