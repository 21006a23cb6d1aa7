// The x86 dequantization kernels of the CPU backend (see dequantize.hpp): the kernels of
// dequantize_x86_kernels.inc compiled twice, for AVX2 with F16C, and for the same with
// AVX512-BF16 (its 256-bit forms), whose one-instruction bf16 rounding frees the vector ports
// that the integer rounding keeps busy (bf16 output is compute-bound on two cores).
#include "dequantize.hpp"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "eredu/core/float_formats.hpp"
#include "eredu/core/quant_formats.hpp"

namespace eredu::cpu::detail {

namespace avx2_kernels {
namespace {
#define EREDU_AVX2 __attribute__((target("avx2,f16c")))
#define EREDU_X86_BF16_NE 0
#include "dequantize_x86_kernels.inc"
#undef EREDU_X86_BF16_NE
#undef EREDU_AVX2
}  // namespace
}  // namespace avx2_kernels

namespace avx512bf16_kernels {
namespace {
#define EREDU_AVX2 __attribute__((target("avx2,f16c,avx512f,avx512vl,avx512bw,avx512bf16")))
#define EREDU_X86_BF16_NE 1
#include "dequantize_x86_kernels.inc"
#undef EREDU_X86_BF16_NE
#undef EREDU_AVX2
}  // namespace
}  // namespace avx512bf16_kernels

DequantizeKernel find_x86_dequantize_kernel(DType from, DType to, DequantizeIsa isa, bool stream) noexcept {
  return isa == DequantizeIsa::avx512bf16 ? avx512bf16_kernels::find(from, to, stream)
                                          : avx2_kernels::find(from, to, stream);
}

}  // namespace eredu::cpu::detail

#else

namespace eredu::cpu::detail {
DequantizeKernel find_x86_dequantize_kernel(DType, DType, DequantizeIsa, bool) noexcept { return nullptr; }
}  // namespace eredu::cpu::detail

#endif
