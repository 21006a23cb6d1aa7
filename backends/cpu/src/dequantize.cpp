// The portable dequantization kernels of the CPU backend (see dequantize.hpp), and the
// choice between them and the x86 ones (dequantize_x86.cpp).
//
// One template decodes a run of blocks: each block through the core reference into an aligned
// f32 scratch block, then the scratch is stored (f32) or rounded and stored (bf16, f16).
// tests/gguf/test_dequantize.cpp checks them against ggml's output.
#include "dequantize.hpp"

#include <cstdint>
#include <cstring>

#include "eredu/core/float_formats.hpp"
#include "eredu/core/quant_formats.hpp"

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
void generic_kernel(const std::byte* __restrict in, std::byte* __restrict out, std::size_t blocks) {
  constexpr DTypeBlock block = dtype_block(T);
  constexpr std::size_t out_size = O == Out::f32 ? 4 : 2;
  const QuantGrids grids = quant::host_quant_grids();
  alignas(64) float scratch[quant::max_block_elements];
  for (std::size_t b = 0; b < blocks; ++b) {
    quant::dequantize_block(T, reinterpret_cast<const std::uint8_t*>(in) + b * block.bytes, scratch, grids);
    store_values<O>(scratch, out + b * block.elements * out_size, block.elements);
  }
}

template <DType T>
DequantizeKernel pick(DType to) noexcept {
  if (to == DType::F32) return generic_kernel<T, Out::f32>;
  if (to == DType::BF16) return generic_kernel<T, Out::bf16>;
  if (to == DType::F16) return generic_kernel<T, Out::f16>;
  return nullptr;
}

}  // namespace

DequantizeKernel find_dequantize_kernel(DType from, DType to, DequantizeIsa isa, bool stream) noexcept {
  if (isa != DequantizeIsa::portable) {
    if (DequantizeKernel k = find_x86_dequantize_kernel(from, to, isa, stream)) return k;
  }
  switch (from) {
#define EREDU_DEQUANTIZE_CASE(t) \
  case DType::t:                 \
    return pick<DType::t>(to);
    EREDU_DEQUANTIZE_TYPES(EREDU_DEQUANTIZE_CASE)
#undef EREDU_DEQUANTIZE_CASE
    default:
      return nullptr;
  }
}

}  // namespace eredu::cpu::detail
