#pragma once
/// \file
/// Bit-exact conversions between f32 and the narrow float formats (bf16, IEEE f16, OCP FP8
/// E4M3 / E5M2, MX scale E8M0), as functions that compile for the host and for the device.
///
/// They implement exactly the semantics of the CPU backend's reference
/// (eredu/cpu/float_formats.hpp): narrowing rounds to nearest, ties to even; a NaN stays a
/// NaN of the same sign with its quiet bit set and its high payload bits kept; widening is
/// exact, bf16 keeps every bit, f16 and FP8 quiet a signalling NaN. They work on bit patterns
/// with integer operations only (f32 values travel as their uint32 bits), so the device
/// results cannot depend on the GPU's float modes (flush-to-zero, fast math), and the host
/// instantiation — compiled by the host compiler, no device needed — is tested exhaustively
/// against the CPU backend (tests/cuda/test_cuda_formats.cpp). Header-only, no CUDA header.

#include <cstdint>

#if defined(__CUDACC__)
#define EREDU_HOST_DEVICE __host__ __device__
#else
#define EREDU_HOST_DEVICE
#endif

namespace eredu::cuda::formats {

/// Index of the highest set bit of a non-zero `v` (31 - count of leading zeros).
EREDU_HOST_DEVICE constexpr int highest_bit(std::uint32_t v) noexcept {
  int n = -1;
  while (v != 0) {
    ++n;
    v >>= 1;
  }
  return n;
}

/// bf16 to f32 bits: the bf16 is the f32's high half, every bit kept.
EREDU_HOST_DEVICE constexpr std::uint32_t bf16_to_f32(std::uint16_t h) noexcept { return std::uint32_t{h} << 16; }

/// f32 bits to bf16, round to nearest even; overflow gives Inf, a NaN a quiet NaN of the same sign.
EREDU_HOST_DEVICE constexpr std::uint16_t f32_to_bf16(std::uint32_t x) noexcept {
  // A NaN whose payload is only in the low half would round to Inf: truncate and quiet it.
  if ((x & 0x7FFF'FFFFu) > 0x7F80'0000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  // + 0x7FFF + the lowest kept bit rounds half to even; a carry into the exponent is
  // exactly rounding up to the next binade (or to Inf).
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
    // mant x 2^-24 with its leading one at bit p is 2^(p-24) x 1.f: f32 exponent p + 103.
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
  // 65520 (halfway between 65504 and 2^16) and above round to Inf.
  if (a >= 0x477F'F000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a >= 0x3880'0000u) {  // a normal f16: rebias the exponent, round at bit 13
    const std::uint32_t rebased = a - (112u << 23);
    return static_cast<std::uint16_t>(sign | ((rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13));
  }
  // A subnormal f16 counts units of 2^-24: m >> (126 - e), rounded half to even. Shifts
  // past 25 leave less than half a unit.
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

/// OCP FP8 E4M3 ("FN") to f32 bits: bias 7, no infinities, 0x7F/0xFF are NaN, max 448.
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

/// OCP FP8 E5M2 to f32 bits: the high byte of an f16.
EREDU_HOST_DEVICE constexpr std::uint32_t f8_e5m2_to_f32(std::uint8_t b) noexcept {
  return f16_to_f32(static_cast<std::uint16_t>(std::uint16_t{b} << 8));
}

/// OCP MX scale E8M0 to f32 bits: 2^(e-127); 0xFF is NaN, 0x00 the f32 subnormal 2^-127.
EREDU_HOST_DEVICE constexpr std::uint32_t f8_e8m0_to_f32(std::uint8_t b) noexcept {
  if (b == 0xFF) return 0x7FC0'0000u;
  if (b == 0) return 0x0040'0000u;
  return std::uint32_t{b} << 23;
}

}  // namespace eredu::cuda::formats
