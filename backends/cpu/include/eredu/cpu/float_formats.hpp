#pragma once
/// \file
/// Scalar, bit-exact conversions between f32 and the narrow float formats checkpoints use
/// (bf16, IEEE f16, OCP FP8 E4M3 / E5M2 and the MX scale E8M0).
///
/// These are the reference semantics of the CPU backend: the buffer kernels in convert.hpp
/// must agree with them bit for bit. Narrowing rounds to nearest, ties to even, as IEEE 754
/// does in its default mode; a NaN stays a NaN of the same sign with its quiet bit set and
/// its high payload bits kept. Widening is exact; bf16 widening keeps every bit, while f16
/// and FP8 widening quiet a signalling NaN as IEEE 754 (and x86's F16C) do. All functions
/// are constexpr and work on bit patterns, so they do not depend on the floating-point
/// environment.

#include <bit>
#include <cstdint>

namespace eredu::cpu {

/// f32 bit pattern of `v`.
constexpr std::uint32_t f32_bits(float v) noexcept { return std::bit_cast<std::uint32_t>(v); }

/// The f32 whose bit pattern is `bits`.
constexpr float f32_from_bits(std::uint32_t bits) noexcept { return std::bit_cast<float>(bits); }

/// bf16 to f32: a 16-bit shift that keeps every bit, NaN payloads included (bf16 is by definition an f32's high half).
constexpr float bf16_to_f32(std::uint16_t h) noexcept { return f32_from_bits(std::uint32_t{h} << 16); }

/// f32 to bf16, round to nearest even; overflow gives Inf, a NaN gives a quiet NaN of the same sign.
constexpr std::uint16_t f32_to_bf16(float v) noexcept {
  const std::uint32_t x = f32_bits(v);
  // A NaN whose payload lives only in the low half would round to Inf (or carry into the
  // sign): truncate it instead and force the quiet bit.
  if ((x & 0x7FFF'FFFFu) > 0x7F80'0000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7FFF plus the lowest kept bit rounds half to even; a carry out of the
  // mantissa bumps the exponent, which is exactly how rounding up to the next binade
  // (or to Inf past the largest finite value) works.
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/// IEEE binary16 to f32: exact, subnormals included; a signalling NaN is quieted.
constexpr float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {
    const std::uint32_t quiet = mant != 0 ? 0x0040'0000u : 0u;
    return f32_from_bits(sign | 0x7F80'0000u | quiet | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // Every f16 subnormal is a normal f32: shift the leading one into the implicit bit.
    const int shift = std::countl_zero(mant) - 21;
    mant = (mant << shift) & 0x3FFu;
    return f32_from_bits(sign | (static_cast<std::uint32_t>(113 - shift) << 23) | (mant << 13));
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// f32 to IEEE binary16, round to nearest even (into subnormals too); overflow gives Inf, NaN a quiet NaN.
constexpr std::uint16_t f32_to_f16(float v) noexcept {
  const std::uint32_t x = f32_bits(v);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFF'FFFFu;
  if (a > 0x7F80'0000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  // 65520 is halfway between 65504 (odd mantissa) and 2^16: it and everything above is Inf.
  if (a >= 0x477F'F000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a >= 0x3880'0000u) {  // 2^-14 and above: a normal f16 (or 2^16 rounded away above)
    const std::uint32_t rebased = a - (112u << 23);
    return static_cast<std::uint16_t>(sign | ((rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13));
  }
  // Subnormal f16: count units of 2^-24. The f32 value is m * 2^(e - 150), so the unit
  // count is m >> (126 - e) before rounding. Shifts past 25 leave less than half a unit.
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

/// OCP FP8 E4M3 ("FN") to f32: bias 7, no infinities, 0x7F/0xFF are NaN, subnormals, max 448.
constexpr float f8_e4m3_to_f32(std::uint8_t b) noexcept {
  const std::uint32_t sign = std::uint32_t{b & 0x80u} << 24;
  const std::uint32_t exp = (b >> 3) & 0xFu;
  const std::uint32_t mant = b & 0x7u;
  if ((b & 0x7Fu) == 0x7Fu) return f32_from_bits(sign | 0x7FC0'0000u);
  if (exp == 0) {
    // m * 2^-9 is exact in f32; a power-of-two scale does not round.
    const float magnitude = static_cast<float>(mant) * 0x1p-9f;
    return f32_from_bits(sign | f32_bits(magnitude));
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (mant << 20));
}

/// OCP FP8 E5M2 to f32: bias 15, IEEE-like (Inf 0x7C/0xFC, NaNs, subnormals); it is the high byte of an f16.
constexpr float f8_e5m2_to_f32(std::uint8_t b) noexcept {
  return f16_to_f32(static_cast<std::uint16_t>(std::uint16_t{b} << 8));
}

/// OCP MX scale E8M0 to f32: 2^(e-127), unsigned, no zero; 0xFF is NaN and 0x00 is the f32 subnormal 2^-127.
constexpr float f8_e8m0_to_f32(std::uint8_t b) noexcept {
  if (b == 0xFF) return f32_from_bits(0x7FC0'0000u);
  if (b == 0) return f32_from_bits(0x0040'0000u);
  return f32_from_bits(std::uint32_t{b} << 23);
}

}  // namespace eredu::cpu
