#pragma once
// The CPU backend's dequantization kernels (private to the backend; convert.cpp routes the
// casts from a quantized dtype through them). Each kernel decodes whole blocks, bit for bit as
// eredu/core/quant_formats.hpp (and so as ggml), into f32, or into bf16 / f16 rounded once from
// that f32. dequantize.cpp has the portable kernels, dequantize_x86.cpp the x86 ones.

#include <cstddef>

#include "eredu/core/dtype.hpp"

namespace eredu::cpu::detail {

// Every quantized dtype with a dequantization, as X(name) for each (both kernel sets switch
// over this one list).
// clang-format off
#define EREDU_DEQUANTIZE_TYPES(X) \
  X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(Q8_K) \
  X(IQ2_XXS) X(IQ2_XS) X(IQ2_S) X(IQ3_XXS) X(IQ3_S) X(IQ1_S) X(IQ1_M) X(IQ4_NL) X(IQ4_XS) \
  X(TQ1_0) X(TQ2_0) X(MXFP4)
// clang-format on

// Decodes `blocks` blocks at `in` into their values at `out` (no alignment needed).
using DequantizeKernel = void (*)(const std::byte* __restrict in, std::byte* __restrict out, std::size_t blocks);

// Which set of kernels a dequantization runs (convert.cpp picks one by what the CPU has and
// which ConvertIsa is wanted). All give the same bits.
enum class DequantizeIsa {
  portable,    // dequantize.cpp
  avx2_f16c,   // dequantize_x86.cpp: AVX2 and F16C
  avx512bf16,  // the same with AVX512-BF16 (and VL) rounding to bf16
};

// The kernel for `from` (quantized, with a dequantization) to `to` (F32, BF16 or F16) in set
// `isa` (the caller checked the CPU has it), or nullptr. `stream`: cache-bypassing stores
// where the kernel has them.
DequantizeKernel find_dequantize_kernel(DType from, DType to, DequantizeIsa isa, bool stream) noexcept;

// The x86 kernel for `from` to `to` in set `isa` (avx2_f16c or avx512bf16), or nullptr where
// the build has none (not x86-64).
DequantizeKernel find_x86_dequantize_kernel(DType from, DType to, DequantizeIsa isa, bool stream) noexcept;

}  // namespace eredu::cpu::detail
