#pragma once
// The CPU backend's dequantization kernels (private to the backend; convert.cpp routes the
// casts from a quantized dtype through them). Each kernel decodes whole blocks, bit for bit as
// eredu/core/quant_formats.hpp (and so as ggml), into f32, or into bf16 / f16 rounded once from
// that f32.

#include <cstddef>

#include "eredu/core/dtype.hpp"

namespace eredu::cpu::detail {

// Decodes `blocks` blocks at `in` into their values at `out` (no alignment needed).
using DequantizeKernel = void (*)(const std::byte* __restrict in, std::byte* __restrict out, std::size_t blocks);

// The kernel for `from` (quantized, with a dequantization) to `to` (F32, BF16 or F16), or
// nullptr. `avx2`: the kernels compiled for AVX2 (the caller checked the CPU has it);
// `stream`: cache-bypassing stores where the kernel has them.
DequantizeKernel find_dequantize_kernel(DType from, DType to, bool avx2, bool stream) noexcept;

}  // namespace eredu::cpu::detail
