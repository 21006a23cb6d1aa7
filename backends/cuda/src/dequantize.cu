// Dequantization kernels of the CUDA backend (see dequantize.cuh).
#include "dequantize.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "eredu/core/float_formats.hpp"
#include "eredu/core/quant_formats.hpp"

namespace eredu::cuda::detail {
namespace {

constexpr unsigned block_threads = 128;

unsigned grid_for(std::size_t work) {
  const std::size_t blocks = (work + block_threads - 1) / block_threads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

enum class Out { f32, bf16, f16 };

// One thread decodes one quantized block into registers / local memory and stores its values.
template <Out O>
__global__ void dequantize_kernel(DType t, const std::uint8_t* __restrict__ in, void* __restrict__ out,
                                  std::size_t blocks, std::uint32_t elements, std::uint32_t bytes,
                                  quant::QuantGrids grids) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    float v[quant::max_block_elements];
    quant::dequantize_block(t, in + b * bytes, v, grids);
    for (std::uint32_t j = 0; j < elements; ++j) {
      const std::uint32_t bits = quant::to_bits(v[j]);
      if constexpr (O == Out::f32) {
        static_cast<std::uint32_t*>(out)[b * elements + j] = bits;
      } else if constexpr (O == Out::bf16) {
        static_cast<std::uint16_t*>(out)[b * elements + j] = formats::f32_to_bf16(bits);
      } else {
        static_cast<std::uint16_t*>(out)[b * elements + j] = formats::f32_to_f16(bits);
      }
    }
  }
}

// The codebooks in device memory, uploaded once per process (the backend drives one device).
struct DeviceGrids {
  quant::QuantGrids grids;
  cudaError_t status = cudaSuccess;
};

const DeviceGrids& device_grids() {
  static DeviceGrids g;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::size_t sizes[6] = {quant::iq2xxs_grid.size(), quant::iq2xs_grid.size(),  quant::iq2s_grid.size(),
                                  quant::iq1s_grid.size(),   quant::iq3xxs_grid.size(), quant::iq3s_grid.size()};
    const std::uint8_t* host[6] = {quant::iq2xxs_grid.data(), quant::iq2xs_grid.data(),  quant::iq2s_grid.data(),
                                   quant::iq1s_grid.data(),   quant::iq3xxs_grid.data(), quant::iq3s_grid.data()};
    std::size_t total = 0;
    for (std::size_t s : sizes) total += s;
    void* memory = nullptr;
    g.status = cudaMalloc(&memory, total);  // kept for the process: the codebooks never change
    if (g.status != cudaSuccess) return;
    auto* base = static_cast<std::uint8_t*>(memory);
    const std::uint8_t* device[6] = {};
    std::size_t at = 0;
    for (int i = 0; i < 6 && g.status == cudaSuccess; ++i) {
      g.status = cudaMemcpy(base + at, host[i], sizes[i], cudaMemcpyHostToDevice);
      device[i] = base + at;
      at += sizes[i];
    }
    g.grids = {device[0], device[1], device[2], device[3], device[4], device[5]};
  });
  return g;
}

}  // namespace

bool dequantize_supported(DType from, DType to) noexcept {
  return quant::has_dequantization(from) && (to == DType::F32 || to == DType::BF16 || to == DType::F16);
}

cudaError_t launch_dequantize(DType from, DType to, const void* in, void* out, std::size_t blocks,
                              cudaStream_t stream) noexcept {
  if (!dequantize_supported(from, to)) return cudaErrorInvalidValue;
  if (blocks == 0) return cudaSuccess;
  const DeviceGrids& g = device_grids();
  if (g.status != cudaSuccess) return g.status;
  const DTypeBlock block = dtype_block(from);
  const auto* src = static_cast<const std::uint8_t*>(in);
  if (to == DType::F32) {
    dequantize_kernel<Out::f32>
        <<<grid_for(blocks), block_threads, 0, stream>>>(from, src, out, blocks, block.elements, block.bytes, g.grids);
  } else if (to == DType::BF16) {
    dequantize_kernel<Out::bf16>
        <<<grid_for(blocks), block_threads, 0, stream>>>(from, src, out, blocks, block.elements, block.bytes, g.grids);
  } else {
    dequantize_kernel<Out::f16>
        <<<grid_for(blocks), block_threads, 0, stream>>>(from, src, out, blocks, block.elements, block.bytes, g.grids);
  }
  return cudaGetLastError();
}

}  // namespace eredu::cuda::detail
