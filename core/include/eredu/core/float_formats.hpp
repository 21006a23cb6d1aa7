#pragma once
/// \file
/// The one reference of eredu's float formats: bit-exact conversions between f32 and the
/// narrow formats checkpoints use (bf16, IEEE f16, OCP FP8 E4M3 / E5M2, the MX scale E8M0),
/// and the set of casts they define (is_supported_cast).
///
/// Semantics: narrowing rounds to nearest, ties to even, as IEEE 754 does in its default
/// mode (into subnormals too); overflow gives Inf; a NaN stays a NaN of the same sign with
/// its quiet bit set and its high payload bits kept. Widening is exact; bf16 widening keeps
/// every bit, while f16 and FP8 widening quiet a signalling NaN, as IEEE 754 and x86's F16C do.
///
/// Every function works on bit patterns (an f32 travels as its uint32 bits) with integer
/// operations only. That is a requirement, not a style: the CUDA kernels call these same
/// functions on the device, where flush-to-zero or fast-math modes would change the result of
/// any float arithmetic on subnormals; integer code gives the same bits on the host, on the
/// device and under any floating-point environment. The CPU backend's vector kernels are
/// separate rewrites held to this reference bit for bit by exhaustive tests
/// (tests/cpu/test_convert.cpp); this reference is itself held to brute-force definitions
/// (double-precision decoders, nearest-even search) by those tests and by
/// tests/cuda/test_cuda_formats.cpp, which also reruns it under FTZ/DAZ.
///
/// C++17 and header-only, with no CUDA header: nvcc compiles the kernels that include it as
/// C++17, marking the element functions `__host__ __device__`. Host code that wants `float`
/// values uses the CPU backend's float-typed view, eredu/cpu/float_formats.hpp.

#include <cstdint>

#include "eredu/core/dtype.hpp"

#if defined(__CUDACC__)
#define EREDU_HOST_DEVICE __host__ __device__
#else
#define EREDU_HOST_DEVICE
#endif

namespace eredu {

/// True when the float formats define a cast from -> to, which is exactly what every backend
/// converts: from == to (a byte copy, any dtype); among {F16, BF16, F32}; from {F8_E4M3,
/// F8_E5M2, F8_E8M0} to {BF16, F32}; and from a quantized dtype with a dequantization (every
/// one but Q8_1; eredu/core/quant_formats.hpp) to {F32, BF16, F16}: ggml's f32 values, rounded
/// once to bf16 or f16. Recipe inference rejects every other cast with
/// errc::recipe_unsupported_cast; each backend's supports_cast reports the casts its kernels
/// implement, and its tests hold that to this set. Host only.
constexpr bool is_supported_cast(DType from, DType to) noexcept {
  const auto wide = [](DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32; };
  const auto f8 = [](DType t) { return t == DType::F8_E4M3 || t == DType::F8_E5M2 || t == DType::F8_E8M0; };
  const bool dequantizable = dtype_is_quantized(from) && from != DType::Q8_1;
  return from == to || (wide(from) && wide(to)) || (f8(from) && (to == DType::BF16 || to == DType::F32)) ||
         (dequantizable && wide(to));
}

/// is_supported_cast's set in words, for error messages ("among F16, BF16, F32; ...").
inline constexpr const char* supported_casts_text =
    "among F16, BF16, F32; from F8_E4M3, F8_E5M2, F8_E8M0 to BF16 or F32; and from a quantized type other than "
    "Q8_1 to F32, BF16 or F16";

/// Element conversions over bit patterns (see file comment).
namespace formats {

/// Index of the highest set bit of a non-zero `v` (31 - count of leading zeros). A loop, not
/// a builtin, so it is constexpr on the host and the device alike; inputs here have at most
/// ten significant bits.
EREDU_HOST_DEVICE constexpr int highest_bit(std::uint32_t v) noexcept {
  int n = -1;
  while (v != 0) {
    ++n;
    v >>= 1;
  }
  return n;
}

/// bf16 to f32 bits: the bf16 is by definition the f32's high half, every bit kept (NaN
/// payloads included).
EREDU_HOST_DEVICE constexpr std::uint32_t bf16_to_f32(std::uint16_t h) noexcept { return std::uint32_t{h} << 16; }

/// f32 bits to bf16, round to nearest even; overflow gives Inf, a NaN a quiet NaN of the same sign.
EREDU_HOST_DEVICE constexpr std::uint16_t f32_to_bf16(std::uint32_t x) noexcept {
  // A NaN whose payload lives only in the low half would round to Inf (or carry into the
  // sign): truncate it instead and force the quiet bit.
  if ((x & 0x7FFF'FFFFu) > 0x7F80'0000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7FFF plus the lowest kept bit rounds half to even; a carry out of the mantissa
  // bumps the exponent, which is exactly how rounding up to the next binade (or to Inf past
  // the largest finite value) works.
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/// IEEE binary16 to f32 bits: exact, subnormals included; a signalling NaN is quieted.
EREDU_HOST_DEVICE constexpr std::uint32_t f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return sign | 0x7F80'0000u | (mant != 0 ? 0x0040'0000u : 0u) | (mant << 13);
  if (exp == 0) {
    if (mant == 0) return sign;
    // Every f16 subnormal is a normal f32: mant x 2^-24 with its leading one at bit p is
    // 2^(p-24) x 1.f, f32 exponent p + 103.
    const int p = highest_bit(mant);
    return sign | (static_cast<std::uint32_t>(p + 103) << 23) | ((mant ^ (1u << p)) << (23 - p));
  }
  return sign | ((exp + 112u) << 23) | (mant << 13);
}

/// f32 bits to IEEE binary16, round to nearest even (into subnormals too); overflow gives
/// Inf, NaN a quiet NaN.
EREDU_HOST_DEVICE constexpr std::uint16_t f32_to_f16(std::uint32_t x) noexcept {
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFF'FFFFu;
  if (a > 0x7F80'0000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  // 65520 is halfway between 65504 (odd mantissa) and 2^16: it and everything above is Inf.
  if (a >= 0x477F'F000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a >= 0x3880'0000u) {  // 2^-14 and above: a normal f16; rebias the exponent, round at bit 13
    const std::uint32_t rebased = a - (112u << 23);
    return static_cast<std::uint16_t>(sign | ((rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13));
  }
  // Subnormal f16: count units of 2^-24. The f32 value is m x 2^(e - 150), so the unit count
  // is m >> (126 - e) before rounding. Shifts past 25 leave less than half a unit.
  const std::uint32_t e = a >> 23;
  if (e < 102) return sign;
  const std::uint32_t m = (a & 0x7F'FFFFu) | 0x80'0000u;
  const std::uint32_t s = 126u - e;
  std::uint32_t q = m >> s;
  const std::uint32_t rem = m & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u) != 0)) ++q;  // may reach 0x400, the smallest normal
  return static_cast<std::uint16_t>(sign | q);
}

/// OCP FP8 E4M3 ("FN") to f32 bits: bias 7, no infinities, 0x7F/0xFF are NaN, subnormals, max 448.
EREDU_HOST_DEVICE constexpr std::uint32_t f8_e4m3_to_f32(std::uint8_t b) noexcept {
  const std::uint32_t sign = std::uint32_t{b & 0x80u} << 24;
  const std::uint32_t exp = (b >> 3) & 0xFu;
  const std::uint32_t mant = b & 0x7u;
  if ((b & 0x7Fu) == 0x7Fu) return sign | 0x7FC0'0000u;
  if (exp == 0) {
    if (mant == 0) return sign;
    // mant x 2^-9 with its leading one at bit p: f32 exponent p - 9 + 127.
    const int p = highest_bit(mant);
    return sign | (static_cast<std::uint32_t>(p + 118) << 23) | ((mant ^ (1u << p)) << (23 - p));
  }
  return sign | ((exp + 120u) << 23) | (mant << 20);
}

/// OCP FP8 E5M2 to f32 bits: bias 15, IEEE-like (Inf 0x7C/0xFC, NaNs, subnormals); it is the
/// high byte of an f16.
EREDU_HOST_DEVICE constexpr std::uint32_t f8_e5m2_to_f32(std::uint8_t b) noexcept {
  return f16_to_f32(static_cast<std::uint16_t>(std::uint16_t{b} << 8));
}

/// OCP MX scale E8M0 to f32 bits: 2^(e-127), unsigned, no zero; 0xFF is NaN and 0x00 the f32
/// subnormal 2^-127 (exact: no float arithmetic, so nothing to flush).
EREDU_HOST_DEVICE constexpr std::uint32_t f8_e8m0_to_f32(std::uint8_t b) noexcept {
  if (b == 0xFF) return 0x7FC0'0000u;
  if (b == 0) return 0x0040'0000u;
  return std::uint32_t{b} << 23;
}

// The casts between two narrow formats go through f32, rounding once: each backend's
// kernels compute exactly these compositions.

/// bf16 to f16: widened exactly, then rounded once to f16.
EREDU_HOST_DEVICE constexpr std::uint16_t bf16_to_f16(std::uint16_t h) noexcept { return f32_to_f16(bf16_to_f32(h)); }

/// f16 to bf16: widened exactly, then rounded once to bf16.
EREDU_HOST_DEVICE constexpr std::uint16_t f16_to_bf16(std::uint16_t h) noexcept { return f32_to_bf16(f16_to_f32(h)); }

/// FP8 E4M3 to bf16: every FP8 value is exact in bf16, so the rounding only quiets NaNs.
EREDU_HOST_DEVICE constexpr std::uint16_t f8_e4m3_to_bf16(std::uint8_t b) noexcept {
  return f32_to_bf16(f8_e4m3_to_f32(b));
}

/// FP8 E5M2 to bf16 (exact; see f8_e4m3_to_bf16).
EREDU_HOST_DEVICE constexpr std::uint16_t f8_e5m2_to_bf16(std::uint8_t b) noexcept {
  return f32_to_bf16(f8_e5m2_to_f32(b));
}

/// E8M0 to bf16 (exact; see f8_e4m3_to_bf16).
EREDU_HOST_DEVICE constexpr std::uint16_t f8_e8m0_to_bf16(std::uint8_t b) noexcept {
  return f32_to_bf16(f8_e8m0_to_f32(b));
}

}  // namespace formats
}  // namespace eredu
