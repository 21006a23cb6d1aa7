#pragma once
// The CUDA backend's dequantization kernels (private to the backend: kernels.cu routes the
// casts from a quantized dtype through them). They decode each block with the core reference,
// eredu/core/quant_formats.hpp, compiled for the device, where its float operations are the
// unfused __fmul_rn / __fadd_rn: bit for bit what the CPU backend and ggml compute.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "eredu/core/dtype.hpp"

namespace eredu::cuda::detail {

// True when a dequantization kernel turns `from` into `to` (F32, BF16 or F16).
bool dequantize_supported(DType from, DType to) noexcept;

// Queues the dequantization of `blocks` blocks at `in` into `out` (4- or 2-byte aligned).
// The first call uploads the IQ codebooks to the current device (synchronously, once).
cudaError_t launch_dequantize(DType from, DType to, const void* in, void* out, std::size_t blocks,
                              cudaStream_t stream) noexcept;

}  // namespace eredu::cuda::detail
