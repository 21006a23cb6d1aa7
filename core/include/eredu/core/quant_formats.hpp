#pragma once
/// \file
/// The one reference of ggml's quantized block formats: how each block of a quantized dtype
/// (eredu::DType Q4_0 ... MXFP4) decodes to f32, bit for bit as ggml's own dequantization
/// (`dequantize_row_*` of ggml-quants.c, which ggml's `to_float` type traits call).
///
/// "Bit for bit" is a matter of doing ggml's float operations in ggml's order, each rounded
/// once: a scale is f16 widened exactly, then every product and sum is one IEEE single
/// operation, never fused. Host code gets that from plain `float` arithmetic compiled without
/// contraction (-ffp-contract=off, and no FMA target); device code from the `__fmul_rn` /
/// `__fadd_rn` intrinsics, which nvcc never fuses. The operation helpers below (mul, add, sub)
/// are the only float arithmetic here, and every decoder spells ggml's expression with them
/// (ggml's `dl * q - ml` is `sub(mul(dl, q), ml)`).
///
/// Block layouts (byte offsets) follow ggml-common.h; multi-byte fields are little-endian.
/// The IQ types index codebooks (eredu/core/detail/quant_grids.hpp) that decoders reach
/// through a QuantGrids of pointers, so host code and device code can hold them in their own
/// memories: host_quant_grids() on the host, a device copy in the CUDA backend.
///
/// C++17 and header-only, with no CUDA header: nvcc compiles the CUDA backend's dequantization
/// kernels from this same file. The CPU backend's vector kernels are separate rewrites held to
/// this reference bit for bit by tests (tests/cpu/test_dequantize.cpp), and this reference is
/// held to ggml's own output by the fixtures in ../shared/data/gguf-quant.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "eredu/core/detail/quant_grids.hpp"
#include "eredu/core/dtype.hpp"
#include "eredu/core/float_formats.hpp"

namespace eredu::quant {

/// True when ggml defines a dequantization of `t`: every quantized dtype except Q8_1 (an
/// activation format ggml only ever quantizes into).
constexpr bool has_dequantization(DType t) noexcept { return dtype_is_quantized(t) && t != DType::Q8_1; }

/// Largest number of values in one block of any dtype (the K-quants' and IQ types' 256).
inline constexpr std::size_t max_block_elements = 256;

/// Largest number of bytes in one block of any dtype (Q8_K's 292).
inline constexpr std::size_t max_block_bytes = 292;

/// The f32 whose bit pattern is `u`.
EREDU_HOST_DEVICE inline float from_bits(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// The bit pattern of `f`.
EREDU_HOST_DEVICE inline std::uint32_t to_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

/// a * b, rounded once (never fused with a neighbouring add).
EREDU_HOST_DEVICE inline float mul(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a + b, rounded once.
EREDU_HOST_DEVICE inline float add(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// a - b, rounded once.
EREDU_HOST_DEVICE inline float sub(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/// Little-endian u16 at `p`.
EREDU_HOST_DEVICE inline std::uint32_t u16le(const std::uint8_t* p) noexcept {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8);
}

/// Little-endian u32 at `p`.
EREDU_HOST_DEVICE inline std::uint32_t u32le(const std::uint8_t* p) noexcept {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24);
}

/// The f16 at `p`, widened exactly (ggml's GGML_FP16_TO_FP32).
EREDU_HOST_DEVICE inline float half_at(const std::uint8_t* p) noexcept {
  return from_bits(formats::f16_to_f32(static_cast<std::uint16_t>(u16le(p))));
}

/// ggml's ggml_e8m0_to_fp32_half: 2^(x - 128) as an exact f32 (subnormal for x < 2; 255 is
/// 2^127, not a NaN, as in ggml).
EREDU_HOST_DEVICE inline float e8m0_half(std::uint8_t x) noexcept {
  return from_bits(x < 2 ? (0x0020'0000u << x) : (static_cast<std::uint32_t>(x - 1) << 23));
}

/// ggml's IQ4_NL codebook (also IQ4_XS's): entry `i` (0-15). A function, not a table, so
/// device code can use it without a device copy.
EREDU_HOST_DEVICE constexpr int iq4nl_value(unsigned i) noexcept {
  constexpr std::int8_t values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return values[i & 15];
}

/// ggml's MXFP4 values, entry `i` (0-15): the E2M1 values doubled (hence the halved E8M0 scale).
EREDU_HOST_DEVICE constexpr int mxfp4_value(unsigned i) noexcept {
  constexpr std::int8_t values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  return values[i & 15];
}

/// ggml's IQ1 grid offset (IQ1S_DELTA, IQ1M_DELTA).
inline constexpr float iq1_delta = 0.125f;

namespace detail {

/// Expands compact grid points (Bits per value, lowest first) into bytes through `digit`.
template <std::size_t N, std::size_t Values, unsigned Bits>
constexpr std::array<std::uint8_t, N * Values> expand_grid(const std::uint16_t (&points)[N],
                                                           const std::uint8_t (&digit)[1u << Bits]) {
  std::array<std::uint8_t, N * Values> grid{};
  for (std::size_t i = 0; i < N; ++i) {
    for (std::size_t v = 0; v < Values; ++v)
      grid[i * Values + v] = digit[(points[i] >> (Bits * v)) & ((1u << Bits) - 1)];
  }
  return grid;
}

// What each digit means in ggml's dequantization grids (checked against ggml-common.h).
inline constexpr std::uint8_t iq2_digits[4] = {0x08, 0x19, 0x2b, 0x00};
inline constexpr std::uint8_t iq1_digits[4] = {0xff, 0x00, 0x01, 0x00};  // int8 -1, 0, 1
inline constexpr std::uint8_t iq3xxs_digits[8] = {0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e};
inline constexpr std::uint8_t iq3s_digits[8] = {0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f};

}  // namespace detail

/// ggml's iq2xxs_grid as bytes: 256 points of 8 values.
inline constexpr auto iq2xxs_grid =
    detail::expand_grid<256, 8, 2>(eredu::quant::detail::kgrid_iq2xxs, detail::iq2_digits);
/// ggml's iq2xs_grid: 512 points of 8 values.
inline constexpr auto iq2xs_grid =
    detail::expand_grid<512, 8, 2>(eredu::quant::detail::kgrid_iq2xs, detail::iq2_digits);
/// ggml's iq2s_grid: 1024 points of 8 values.
inline constexpr auto iq2s_grid = detail::expand_grid<1024, 8, 2>(eredu::quant::detail::kgrid_iq2s, detail::iq2_digits);
/// ggml's iq1s_grid: 2048 points of 8 int8 values (-1, 0, 1), stored as their bytes.
inline constexpr auto iq1s_grid = detail::expand_grid<2048, 8, 2>(eredu::quant::detail::kgrid_iq1s, detail::iq1_digits);
/// ggml's iq3xxs_grid: 256 points of 4 values.
inline constexpr auto iq3xxs_grid =
    detail::expand_grid<256, 4, 3>(eredu::quant::detail::kgrid_iq3xxs, detail::iq3xxs_digits);
/// ggml's iq3s_grid: 512 points of 4 values.
inline constexpr auto iq3s_grid = detail::expand_grid<512, 4, 3>(eredu::quant::detail::kgrid_iq3s, detail::iq3s_digits);

/// Where a decoder finds the IQ codebooks (each point's values contiguous, as above): host
/// memory for host code, device memory for kernels.
struct QuantGrids {
  const std::uint8_t* iq2xxs = nullptr;  ///< 256 x 8
  const std::uint8_t* iq2xs = nullptr;   ///< 512 x 8
  const std::uint8_t* iq2s = nullptr;    ///< 1024 x 8
  const std::uint8_t* iq1s = nullptr;    ///< 2048 x 8 (int8 values)
  const std::uint8_t* iq3xxs = nullptr;  ///< 256 x 4
  const std::uint8_t* iq3s = nullptr;    ///< 512 x 4
};

/// The codebooks in host memory.
inline QuantGrids host_quant_grids() noexcept {
  return {iq2xxs_grid.data(), iq2xs_grid.data(),  iq2s_grid.data(),
          iq1s_grid.data(),   iq3xxs_grid.data(), iq3s_grid.data()};
}

/// ggml's sign table for the IQ2/IQ3 types: 7 sign bits plus the parity bit that makes the
/// count of minus signs even.
EREDU_HOST_DEVICE inline std::uint32_t iq_signs(std::uint32_t seven) noexcept {
  std::uint32_t ones = 0;
  for (std::uint32_t v = seven; v != 0; v >>= 1) ones += v & 1u;
  return seven | ((ones & 1u) << 7);
}

/// +1 or -1 for bit `j` of `signs` (ggml multiplies by it, so a zero keeps ggml's sign).
EREDU_HOST_DEVICE inline float sign_of(std::uint32_t signs, int j) noexcept { return (signs >> j) & 1u ? -1.f : 1.f; }

// ---- one decoder per type: `b` is one block, `y` receives dtype_block(t).elements floats ----

/// Q4_0: y = (q - 8) * d.
EREDU_HOST_DEVICE inline void dequantize_q4_0(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = mul(static_cast<float>((b[2 + j] & 0x0F) - 8), d);
    y[j + 16] = mul(static_cast<float>((b[2 + j] >> 4) - 8), d);
  }
}

/// Q4_1: y = q * d + m.
EREDU_HOST_DEVICE inline void dequantize_q4_1(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b), m = half_at(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = add(mul(static_cast<float>(b[4 + j] & 0x0F), d), m);
    y[j + 16] = add(mul(static_cast<float>(b[4 + j] >> 4), d), m);
  }
}

/// Q5_0: y = (q - 16) * d, the fifth bits in a u32.
EREDU_HOST_DEVICE inline void dequantize_q5_0(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b);
  const std::uint32_t qh = u32le(b + 2);
  for (int j = 0; j < 16; ++j) {
    const std::uint32_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
    y[j] = mul(static_cast<float>(static_cast<int>((b[6 + j] & 0x0F) | h0) - 16), d);
    y[j + 16] = mul(static_cast<float>(static_cast<int>((b[6 + j] >> 4) | h1) - 16), d);
  }
}

/// Q5_1: y = q * d + m.
EREDU_HOST_DEVICE inline void dequantize_q5_1(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b), m = half_at(b + 2);
  const std::uint32_t qh = u32le(b + 4);
  for (int j = 0; j < 16; ++j) {
    const std::uint32_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
    y[j] = add(mul(static_cast<float>((b[8 + j] & 0x0F) | h0), d), m);
    y[j + 16] = add(mul(static_cast<float>((b[8 + j] >> 4) | h1), d), m);
  }
}

/// Q8_0: y = q * d.
EREDU_HOST_DEVICE inline void dequantize_q8_0(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = mul(static_cast<float>(static_cast<std::int8_t>(b[2 + j])), d);
}

/// MXFP4: y = value * 2^(e - 128).
EREDU_HOST_DEVICE inline void dequantize_mxfp4(const std::uint8_t* b, float* y) noexcept {
  const float d = e8m0_half(b[0]);
  for (int j = 0; j < 16; ++j) {
    y[j] = mul(static_cast<float>(mxfp4_value(b[1 + j] & 0x0F)), d);
    y[j + 16] = mul(static_cast<float>(mxfp4_value(b[1 + j] >> 4)), d);
  }
}

/// Q2_K: y = (d * scale) * q - (dmin * min), 16 sub-blocks of 16.
EREDU_HOST_DEVICE inline void dequantize_q2_k(const std::uint8_t* b, float* y) noexcept {
  const std::uint8_t* scales = b;
  const std::uint8_t* q = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const std::uint8_t sc = scales[is++];
        const float dl = mul(d, static_cast<float>(sc & 0xF)), ml = mul(dmin, static_cast<float>(sc >> 4));
        for (int l = 0; l < 16; ++l) *y++ = sub(mul(dl, static_cast<float>((q[l + 16 * half] >> shift) & 3)), ml);
      }
    }
    q += 32;
  }
}

/// The 16 6-bit scales of a Q3_K block from its 12 packed bytes at `packed` (low nibbles in
/// bytes 0-7, the high 2 bits in bytes 8-11): scale `j` is byte `j % 4` (little-endian) of
/// `aux[j / 4]`.
EREDU_HOST_DEVICE inline void q3_k_scale_words(const std::uint8_t* packed, std::uint32_t (&aux)[4]) noexcept {
  constexpr std::uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const std::uint32_t a0 = u32le(packed), a1 = u32le(packed + 4), tmp = u32le(packed + 8);
  aux[0] = (a0 & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (a1 & kmask2) | (((tmp >> 2) & kmask1) << 4);
  aux[2] = ((a0 >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((a1 >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
}

/// Q3_K: y = (d * (scale - 32)) * (q - 4 unless the high bit is set), 16 sub-blocks of 16.
EREDU_HOST_DEVICE inline void dequantize_q3_k(const std::uint8_t* b, float* y) noexcept {
  const std::uint8_t* hm = b;
  const std::uint8_t* q = b + 32;
  const float d_all = half_at(b + 108);
  std::uint32_t aux[4];
  q3_k_scale_words(b + 96, aux);
  int is = 0;
  std::uint32_t m = 1;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const auto sc = static_cast<std::int8_t>((aux[is / 4] >> (8 * (is % 4))) & 0xFF);
        ++is;
        const float dl = mul(d_all, static_cast<float>(sc - 32));
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * half;
          const int v = static_cast<int>((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
          *y++ = mul(dl, static_cast<float>(v));
        }
      }
      m <<= 1;
    }
    q += 32;
  }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K or Q5_K block (ggml's get_scale_min_k4).
EREDU_HOST_DEVICE inline void scale_min_k4(int j, const std::uint8_t* q, std::uint32_t& d, std::uint32_t& m) noexcept {
  if (j < 4) {
    d = q[j] & 63u;
    m = q[j + 4] & 63u;
  } else {
    d = (q[j + 4] & 0xFu) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// Q4_K: y = (d * scale) * q - (dmin * min), 8 sub-blocks of 32.
EREDU_HOST_DEVICE inline void dequantize_q4_k(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b), dmin = half_at(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* q = b + 16;
  for (int is = 0; is < 8; is += 2) {
    std::uint32_t sc = 0, m = 0;
    scale_min_k4(is, scales, sc, m);
    const float d1 = mul(d, static_cast<float>(sc)), m1 = mul(dmin, static_cast<float>(m));
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = mul(d, static_cast<float>(sc)), m2 = mul(dmin, static_cast<float>(m));
    for (int l = 0; l < 32; ++l) y[l] = sub(mul(d1, static_cast<float>(q[l] & 0xF)), m1);
    for (int l = 0; l < 32; ++l) y[l + 32] = sub(mul(d2, static_cast<float>(q[l] >> 4)), m2);
    y += 64;
    q += 32;
  }
}

/// Q5_K: Q4_K with a fifth bit per value.
EREDU_HOST_DEVICE inline void dequantize_q5_k(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b), dmin = half_at(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* ql = b + 48;
  std::uint32_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2) {
    std::uint32_t sc = 0, m = 0;
    scale_min_k4(is, scales, sc, m);
    const float d1 = mul(d, static_cast<float>(sc)), m1 = mul(dmin, static_cast<float>(m));
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = mul(d, static_cast<float>(sc)), m2 = mul(dmin, static_cast<float>(m));
    for (int l = 0; l < 32; ++l) y[l] = sub(mul(d1, static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0))), m1);
    for (int l = 0; l < 32; ++l)
      y[l + 32] = sub(mul(d2, static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0))), m2);
    y += 64;
    ql += 32;
    u1 <<= 2;
    u2 <<= 2;
  }
}

/// Q6_K: y = (d * scale) * (q - 32), 16 sub-blocks of 16.
EREDU_HOST_DEVICE inline void dequantize_q6_k(const std::uint8_t* b, float* y) noexcept {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const std::uint8_t* sc = b + 192;
  const float d = half_at(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = mul(mul(d, static_cast<float>(static_cast<std::int8_t>(sc[is]))), static_cast<float>(q1));
      y[l + 32] = mul(mul(d, static_cast<float>(static_cast<std::int8_t>(sc[is + 2]))), static_cast<float>(q2));
      y[l + 64] = mul(mul(d, static_cast<float>(static_cast<std::int8_t>(sc[is + 4]))), static_cast<float>(q3));
      y[l + 96] = mul(mul(d, static_cast<float>(static_cast<std::int8_t>(sc[is + 6]))), static_cast<float>(q4));
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

/// Q8_K: y = d * q with an f32 scale.
EREDU_HOST_DEVICE inline void dequantize_q8_k(const std::uint8_t* b, float* y) noexcept {
  const float d = from_bits(u32le(b));
  for (int j = 0; j < 256; ++j) y[j] = mul(d, static_cast<float>(static_cast<std::int8_t>(b[4 + j])));
}

/// IQ2_XXS: 8 groups of 32; per group a u32 of 4 grid indices and a u32 of signs and scale.
EREDU_HOST_DEVICE inline void dequantize_iq2_xxs(const std::uint8_t* b, float* y, const QuantGrids& g) noexcept {
  const float d = half_at(b);
  for (int ib = 0; ib < 8; ++ib) {
    const std::uint8_t* idx = b + 2 + 8 * ib;
    const std::uint32_t aux = u32le(idx + 4);
    const float db = mul(mul(d, add(0.5f, static_cast<float>(aux >> 28))), 0.25f);
    for (int l = 0; l < 4; ++l) {
      const std::uint8_t* grid = g.iq2xxs + 8 * idx[l];
      const std::uint32_t signs = iq_signs((aux >> (7 * l)) & 127);
      for (int j = 0; j < 8; ++j) y[j] = mul(mul(db, static_cast<float>(grid[j])), sign_of(signs, j));
      y += 8;
    }
  }
}

/// IQ2_XS: u16 codes of 9 index bits and 7 sign bits, a 4-bit scale per 16 values.
EREDU_HOST_DEVICE inline void dequantize_iq2_xs(const std::uint8_t* b, float* y, const QuantGrids& g) noexcept {
  const float d = half_at(b);
  const std::uint8_t* scales = b + 66;
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {mul(mul(d, add(0.5f, static_cast<float>(scales[ib] & 0xf))), 0.25f),
                         mul(mul(d, add(0.5f, static_cast<float>(scales[ib] >> 4))), 0.25f)};
    for (int l = 0; l < 4; ++l) {
      const std::uint32_t code = u16le(b + 2 + 2 * (4 * ib + l));
      const std::uint8_t* grid = g.iq2xs + 8 * (code & 511);
      const std::uint32_t signs = iq_signs(code >> 9);
      for (int j = 0; j < 8; ++j) y[j] = mul(mul(db[l / 2], static_cast<float>(grid[j])), sign_of(signs, j));
      y += 8;
    }
  }
}

/// IQ2_S: 10-bit grid indices, explicit sign bytes, a 4-bit scale per 16 values.
EREDU_HOST_DEVICE inline void dequantize_iq2_s(const std::uint8_t* b, float* y, const QuantGrids& g) noexcept {
  const float d = half_at(b);
  const std::uint8_t* qs = b + 2;
  const std::uint8_t* signs = b + 2 + 32;
  const std::uint8_t* qh = b + 66;
  const std::uint8_t* scales = b + 74;
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {mul(mul(d, add(0.5f, static_cast<float>(scales[ib] & 0xf))), 0.25f),
                         mul(mul(d, add(0.5f, static_cast<float>(scales[ib] >> 4))), 0.25f)};
    for (int l = 0; l < 4; ++l) {
      const std::uint32_t index = qs[l] | ((static_cast<std::uint32_t>(qh[ib]) << (8 - 2 * l)) & 0x300);
      const std::uint8_t* grid = g.iq2s + 8 * index;
      for (int j = 0; j < 8; ++j) y[j] = mul(mul(db[l / 2], static_cast<float>(grid[j])), sign_of(signs[l], j));
      y += 8;
    }
    qs += 4;
    signs += 4;
  }
}

/// IQ3_XXS: 8-bit indices into a 4-value grid, a u32 of signs and scale per 32 values.
EREDU_HOST_DEVICE inline void dequantize_iq3_xxs(const std::uint8_t* b, float* y, const QuantGrids& g) noexcept {
  const float d = half_at(b);
  const std::uint8_t* qs = b + 2;
  const std::uint8_t* scales_and_signs = b + 2 + 64;
  for (int ib = 0; ib < 8; ++ib) {
    const std::uint32_t aux = u32le(scales_and_signs + 4 * ib);
    const float db = mul(mul(d, add(0.5f, static_cast<float>(aux >> 28))), 0.5f);
    for (int l = 0; l < 4; ++l) {
      const std::uint32_t signs = iq_signs((aux >> (7 * l)) & 127);
      const std::uint8_t* grid1 = g.iq3xxs + 4 * qs[2 * l];
      const std::uint8_t* grid2 = g.iq3xxs + 4 * qs[2 * l + 1];
      for (int j = 0; j < 4; ++j) {
        y[j] = mul(mul(db, static_cast<float>(grid1[j])), sign_of(signs, j));
        y[j + 4] = mul(mul(db, static_cast<float>(grid2[j])), sign_of(signs, j + 4));
      }
      y += 8;
    }
    qs += 8;
  }
}

/// IQ3_S: 9-bit indices into a 4-value grid, explicit signs, a 4-bit odd scale per 32 values.
EREDU_HOST_DEVICE inline void dequantize_iq3_s(const std::uint8_t* b, float* y, const QuantGrids& g) noexcept {
  const float d = half_at(b);
  const std::uint8_t* qs = b + 2;
  const std::uint8_t* qh = b + 66;
  const std::uint8_t* signs = b + 74;
  const std::uint8_t* scales = b + 106;
  for (int ib = 0; ib < 8; ib += 2) {
    const float db[2] = {mul(d, static_cast<float>(1 + 2 * (scales[ib / 2] & 0xf))),
                         mul(d, static_cast<float>(1 + 2 * (scales[ib / 2] >> 4)))};
    for (int part = 0; part < 2; ++part) {
      const std::uint32_t h = qh[part];
      for (int l = 0; l < 4; ++l) {
        const std::uint8_t* grid1 = g.iq3s + 4 * (qs[2 * l] | ((h << (8 - 2 * l)) & 256));
        const std::uint8_t* grid2 = g.iq3s + 4 * (qs[2 * l + 1] | ((h << (7 - 2 * l)) & 256));
        for (int j = 0; j < 4; ++j) {
          y[j] = mul(mul(db[part], static_cast<float>(grid1[j])), sign_of(signs[l], j));
          y[j + 4] = mul(mul(db[part], static_cast<float>(grid2[j])), sign_of(signs[l], j + 4));
        }
        y += 8;
      }
      qs += 8;
      signs += 4;
    }
    qh += 2;
  }
}

/// IQ1_S: 11-bit indices into a ternary grid shifted by +-1/8, a 3-bit odd scale per 32.
EREDU_HOST_DEVICE inline void dequantize_iq1_s(const std::uint8_t* b, float* y, const QuantGrids& g) noexcept {
  const float d = half_at(b);
  const std::uint8_t* qs = b + 2;
  for (int ib = 0; ib < 8; ++ib) {
    const std::uint32_t qh = u16le(b + 34 + 2 * ib);
    const float dl = mul(d, static_cast<float>(2 * ((qh >> 12) & 7) + 1));
    const float delta = (qh & 0x8000) ? -iq1_delta : iq1_delta;
    for (int l = 0; l < 4; ++l) {
      const std::uint8_t* grid = g.iq1s + 8 * (qs[l] | (((qh >> (3 * l)) & 7) << 8));
      for (int j = 0; j < 8; ++j) y[j] = mul(dl, add(static_cast<float>(static_cast<std::int8_t>(grid[j])), delta));
      y += 8;
    }
    qs += 4;
  }
}

/// IQ1_M: IQ1_S's grid with a shift per 8 values, 3-bit scales and an f16 scale spread over
/// the scale bytes' top nibbles.
EREDU_HOST_DEVICE inline void dequantize_iq1_m(const std::uint8_t* b, float* y, const QuantGrids& g) noexcept {
  const std::uint8_t* qs = b;
  const std::uint8_t* qh = b + 32;
  const std::uint32_t sc[4] = {u16le(b + 48), u16le(b + 50), u16le(b + 52), u16le(b + 54)};
  const std::uint32_t bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
  const float d = from_bits(formats::f16_to_f32(static_cast<std::uint16_t>(bits)));
  for (int ib = 0; ib < 8; ++ib) {
    const float dl1 = mul(d, static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1));
    const float dl2 = mul(d, static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1));
    const std::uint32_t h0 = qh[0], h1 = qh[1];
    const std::uint32_t idx[4] = {qs[0] | ((h0 << 8) & 0x700), qs[1] | ((h0 << 4) & 0x700), qs[2] | ((h1 << 8) & 0x700),
                                  qs[3] | ((h1 << 4) & 0x700)};
    const float delta[4] = {(h0 & 0x08) ? -iq1_delta : iq1_delta, (h0 & 0x80) ? -iq1_delta : iq1_delta,
                            (h1 & 0x08) ? -iq1_delta : iq1_delta, (h1 & 0x80) ? -iq1_delta : iq1_delta};
    for (int l = 0; l < 4; ++l) {
      const std::uint8_t* grid = g.iq1s + 8 * idx[l];
      const float dl = l < 2 ? dl1 : dl2;
      for (int j = 0; j < 8; ++j) y[j] = mul(dl, add(static_cast<float>(static_cast<std::int8_t>(grid[j])), delta[l]));
      y += 8;
    }
    qs += 4;
    qh += 2;
  }
}

/// IQ4_NL: y = d * codebook[q].
EREDU_HOST_DEVICE inline void dequantize_iq4_nl(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = mul(d, static_cast<float>(iq4nl_value(b[2 + j] & 0xf)));
    y[j + 16] = mul(d, static_cast<float>(iq4nl_value(b[2 + j] >> 4)));
  }
}

/// IQ4_XS: IQ4_NL's codebook with a 6-bit scale per 32 values.
EREDU_HOST_DEVICE inline void dequantize_iq4_xs(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b);
  const std::uint32_t scales_h = u16le(b + 2);
  const std::uint8_t* scales_l = b + 4;
  const std::uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = static_cast<int>(((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4));
    const float dl = mul(d, static_cast<float>(ls - 32));
    for (int j = 0; j < 16; ++j) {
      y[j] = mul(dl, static_cast<float>(iq4nl_value(qs[j] & 0xf)));
      y[j + 16] = mul(dl, static_cast<float>(iq4nl_value(qs[j] >> 4)));
    }
    y += 32;
    qs += 16;
  }
}

/// The ternary digit of TQ1_0 byte `q` at position `n` (ggml's fixed-point base-3 decode).
EREDU_HOST_DEVICE inline int tq1_digit(std::uint8_t q, int n) noexcept {
  constexpr std::uint8_t pow3[5] = {1, 3, 9, 27, 81};
  const auto shifted = static_cast<std::uint8_t>(q * pow3[n]);
  return static_cast<int>((static_cast<std::uint32_t>(shifted) * 3) >> 8);
}

/// TQ1_0: 5 ternary values per byte (4 per byte in the tail), y = (t - 1) * d.
EREDU_HOST_DEVICE inline void dequantize_tq1_0(const std::uint8_t* b, float* y) noexcept {
  const std::uint8_t* qs = b;
  const std::uint8_t* qh = b + 48;
  const float d = half_at(b + 52);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) *y++ = mul(static_cast<float>(tq1_digit(qs[m], n) - 1), d);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) *y++ = mul(static_cast<float>(tq1_digit(qs[32 + m], n) - 1), d);
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) *y++ = mul(static_cast<float>(tq1_digit(qh[j], n) - 1), d);
}

/// TQ2_0: 2-bit ternary values, y = (t - 1) * d.
EREDU_HOST_DEVICE inline void dequantize_tq2_0(const std::uint8_t* b, float* y) noexcept {
  const float d = half_at(b + 64);
  for (int j = 0; j < 64; j += 32)
    for (int l = 0; l < 4; ++l)
      for (int m = 0; m < 32; ++m) *y++ = mul(static_cast<float>(static_cast<int>((b[j + m] >> (2 * l)) & 3) - 1), d);
}

/// Decodes one block of `t` (has_dequantization(t)) at `in` into dtype_block(t).elements
/// floats at `out`. Returns false, writing nothing, for a dtype without a dequantization.
EREDU_HOST_DEVICE inline bool dequantize_block(DType t, const std::uint8_t* in, float* out,
                                               const QuantGrids& g) noexcept {
  switch (t) {
    case DType::Q4_0:
      dequantize_q4_0(in, out);
      return true;
    case DType::Q4_1:
      dequantize_q4_1(in, out);
      return true;
    case DType::Q5_0:
      dequantize_q5_0(in, out);
      return true;
    case DType::Q5_1:
      dequantize_q5_1(in, out);
      return true;
    case DType::Q8_0:
      dequantize_q8_0(in, out);
      return true;
    case DType::Q2_K:
      dequantize_q2_k(in, out);
      return true;
    case DType::Q3_K:
      dequantize_q3_k(in, out);
      return true;
    case DType::Q4_K:
      dequantize_q4_k(in, out);
      return true;
    case DType::Q5_K:
      dequantize_q5_k(in, out);
      return true;
    case DType::Q6_K:
      dequantize_q6_k(in, out);
      return true;
    case DType::Q8_K:
      dequantize_q8_k(in, out);
      return true;
    case DType::IQ2_XXS:
      dequantize_iq2_xxs(in, out, g);
      return true;
    case DType::IQ2_XS:
      dequantize_iq2_xs(in, out, g);
      return true;
    case DType::IQ2_S:
      dequantize_iq2_s(in, out, g);
      return true;
    case DType::IQ3_XXS:
      dequantize_iq3_xxs(in, out, g);
      return true;
    case DType::IQ3_S:
      dequantize_iq3_s(in, out, g);
      return true;
    case DType::IQ1_S:
      dequantize_iq1_s(in, out, g);
      return true;
    case DType::IQ1_M:
      dequantize_iq1_m(in, out, g);
      return true;
    case DType::IQ4_NL:
      dequantize_iq4_nl(in, out);
      return true;
    case DType::IQ4_XS:
      dequantize_iq4_xs(in, out);
      return true;
    case DType::TQ1_0:
      dequantize_tq1_0(in, out);
      return true;
    case DType::TQ2_0:
      dequantize_tq2_0(in, out);
      return true;
    case DType::MXFP4:
      dequantize_mxfp4(in, out);
      return true;
    default:
      return false;
  }
}

}  // namespace eredu::quant
