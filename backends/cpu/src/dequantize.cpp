// Dequantization kernels of the CPU backend (see dequantize.hpp).
//
// One template decodes a run of blocks: each block through the core reference into an aligned
// f32 scratch block, then the scratch is stored (f32) or rounded and stored (bf16, f16). The
// same template is compiled twice, portable and for AVX2: the reference's per-sub-block loops
// are straight-line mul/sub over 16 or 32 lanes, which g++ vectorizes eight lanes wide under
// AVX2 without changing a single operation (no FMA: this file is compiled with
// -ffp-contract=off and the AVX2 target has no FMA), so both sets give the reference's bits;
// tests/cpu/test_dequantize.cpp checks both against ggml's output.
#include "dequantize.hpp"

#include <cstdint>
#include <cstring>

#include "eredu/core/float_formats.hpp"
#include "eredu/core/quant_formats.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define EREDU_DEQUANTIZE_X86 1
#else
#define EREDU_DEQUANTIZE_X86 0
#endif

namespace eredu::cpu::detail {
namespace {

using quant::QuantGrids;

// Branchless f32 -> bf16 (round to nearest even, NaN quieted): formats::f32_to_bf16 with the
// branch as a select, so the store loop vectorizes.
inline std::uint16_t round_bf16(std::uint32_t x) noexcept {
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7FFF'FFFFu) > 0x7F80'0000u ? quiet_nan : rounded);
}

enum class Out { f32, bf16, f16 };

// Stores n scratch floats at `out` in format O.
template <Out O>
inline void store_values(const float* __restrict v, std::byte* __restrict out, std::size_t n) noexcept {
  if constexpr (O == Out::f32) {
    std::memcpy(out, v, n * sizeof(float));
  } else {
    for (std::size_t j = 0; j < n; ++j) {
      std::uint32_t bits;
      std::memcpy(&bits, v + j, sizeof bits);
      const std::uint16_t h = O == Out::bf16 ? round_bf16(bits) : formats::f32_to_f16(bits);
      std::memcpy(out + 2 * j, &h, sizeof h);
    }
  }
}

template <DType T, Out O>
inline void dequantize_run(const std::byte* __restrict in, std::byte* __restrict out, std::size_t blocks) noexcept {
  constexpr DTypeBlock block = dtype_block(T);
  constexpr std::size_t out_size = O == Out::f32 ? 4 : 2;
  const QuantGrids grids = quant::host_quant_grids();
  alignas(64) float scratch[quant::max_block_elements];
  for (std::size_t b = 0; b < blocks; ++b) {
    quant::dequantize_block(T, reinterpret_cast<const std::uint8_t*>(in) + b * block.bytes, scratch, grids);
    store_values<O>(scratch, out + b * block.elements * out_size, block.elements);
  }
}

template <DType T, Out O>
void generic_kernel(const std::byte* __restrict in, std::byte* __restrict out, std::size_t blocks) {
  dequantize_run<T, O>(in, out, blocks);
}

#if EREDU_DEQUANTIZE_X86
template <DType T, Out O>
__attribute__((target("avx2"))) void avx2_kernel(const std::byte* __restrict in, std::byte* __restrict out,
                                                 std::size_t blocks) {
  dequantize_run<T, O>(in, out, blocks);
}

// f32 output with streaming stores, for large outputs a loader does not read back soon: each
// block's values go from the scratch straight past the cache. Needs a 32-byte aligned output
// (every block's output then stays aligned: its size is a multiple of 128 bytes).
template <DType T>
__attribute__((target("avx2"))) void avx2_stream_f32_kernel(const std::byte* __restrict in, std::byte* __restrict out,
                                                            std::size_t blocks) {
  constexpr DTypeBlock block = dtype_block(T);
  if (reinterpret_cast<std::uintptr_t>(out) % 32 != 0) {
    dequantize_run<T, Out::f32>(in, out, blocks);
    return;
  }
  const QuantGrids grids = quant::host_quant_grids();
  alignas(64) float scratch[quant::max_block_elements];
  for (std::size_t b = 0; b < blocks; ++b) {
    quant::dequantize_block(T, reinterpret_cast<const std::uint8_t*>(in) + b * block.bytes, scratch, grids);
    auto* o = reinterpret_cast<float*>(out + b * block.elements * 4);
    for (std::size_t j = 0; j < block.elements; j += 8) _mm256_stream_ps(o + j, _mm256_load_ps(scratch + j));
  }
  // Streaming stores are weakly ordered: fence before another thread may see "done".
  _mm_sfence();
}
#endif

template <DType T>
DequantizeKernel pick(DType to, bool avx2, bool stream) noexcept {
#if EREDU_DEQUANTIZE_X86
  if (avx2) {
    if (to == DType::F32) return stream ? avx2_stream_f32_kernel<T> : avx2_kernel<T, Out::f32>;
    if (to == DType::BF16) return avx2_kernel<T, Out::bf16>;
    if (to == DType::F16) return avx2_kernel<T, Out::f16>;
    return nullptr;
  }
#else
  (void)avx2;
  (void)stream;
#endif
  if (to == DType::F32) return generic_kernel<T, Out::f32>;
  if (to == DType::BF16) return generic_kernel<T, Out::bf16>;
  if (to == DType::F16) return generic_kernel<T, Out::f16>;
  return nullptr;
}

}  // namespace

DequantizeKernel find_dequantize_kernel(DType from, DType to, bool avx2, bool stream) noexcept {
  switch (from) {
#define EREDU_DEQUANTIZE_CASE(t) \
  case DType::t:                 \
    return pick<DType::t>(to, avx2, stream);
    EREDU_DEQUANTIZE_CASE(Q4_0)
    EREDU_DEQUANTIZE_CASE(Q4_1)
    EREDU_DEQUANTIZE_CASE(Q5_0)
    EREDU_DEQUANTIZE_CASE(Q5_1)
    EREDU_DEQUANTIZE_CASE(Q8_0)
    EREDU_DEQUANTIZE_CASE(Q2_K)
    EREDU_DEQUANTIZE_CASE(Q3_K)
    EREDU_DEQUANTIZE_CASE(Q4_K)
    EREDU_DEQUANTIZE_CASE(Q5_K)
    EREDU_DEQUANTIZE_CASE(Q6_K)
    EREDU_DEQUANTIZE_CASE(Q8_K)
    EREDU_DEQUANTIZE_CASE(IQ2_XXS)
    EREDU_DEQUANTIZE_CASE(IQ2_XS)
    EREDU_DEQUANTIZE_CASE(IQ2_S)
    EREDU_DEQUANTIZE_CASE(IQ3_XXS)
    EREDU_DEQUANTIZE_CASE(IQ3_S)
    EREDU_DEQUANTIZE_CASE(IQ1_S)
    EREDU_DEQUANTIZE_CASE(IQ1_M)
    EREDU_DEQUANTIZE_CASE(IQ4_NL)
    EREDU_DEQUANTIZE_CASE(IQ4_XS)
    EREDU_DEQUANTIZE_CASE(TQ1_0)
    EREDU_DEQUANTIZE_CASE(TQ2_0)
    EREDU_DEQUANTIZE_CASE(MXFP4)
#undef EREDU_DEQUANTIZE_CASE
    default:
      return nullptr;
  }
}

}  // namespace eredu::cpu::detail
