#pragma once
/// \file
/// The float formats' reference (eredu/core/float_formats.hpp) seen with `float` values, for
/// host code that computes with the numbers: examples, the canary and pipeline matvecs, tests.
///
/// Each function is the core reference's conversion with the f32 side bit-cast to `float`;
/// no conversion logic lives here, so there is one definition of every format (the CPU
/// backend's buffer kernels in convert.hpp are held to it bit for bit). All are constexpr and
/// work on bit patterns, so they do not depend on the floating-point environment.

#include <bit>
#include <cstdint>

#include "eredu/core/float_formats.hpp"

namespace eredu::cpu {

/// f32 bit pattern of `v`.
constexpr std::uint32_t f32_bits(float v) noexcept { return std::bit_cast<std::uint32_t>(v); }

/// The f32 whose bit pattern is `bits`.
constexpr float f32_from_bits(std::uint32_t bits) noexcept { return std::bit_cast<float>(bits); }

/// bf16 to f32: a 16-bit shift that keeps every bit, NaN payloads included.
constexpr float bf16_to_f32(std::uint16_t h) noexcept { return f32_from_bits(formats::bf16_to_f32(h)); }

/// f32 to bf16, round to nearest even; overflow gives Inf, a NaN gives a quiet NaN of the same sign.
constexpr std::uint16_t f32_to_bf16(float v) noexcept { return formats::f32_to_bf16(f32_bits(v)); }

/// IEEE binary16 to f32: exact, subnormals included; a signalling NaN is quieted.
constexpr float f16_to_f32(std::uint16_t h) noexcept { return f32_from_bits(formats::f16_to_f32(h)); }

/// f32 to IEEE binary16, round to nearest even (into subnormals too); overflow gives Inf, NaN a quiet NaN.
constexpr std::uint16_t f32_to_f16(float v) noexcept { return formats::f32_to_f16(f32_bits(v)); }

/// OCP FP8 E4M3 ("FN") to f32: bias 7, no infinities, 0x7F/0xFF are NaN, subnormals, max 448.
constexpr float f8_e4m3_to_f32(std::uint8_t b) noexcept { return f32_from_bits(formats::f8_e4m3_to_f32(b)); }

/// OCP FP8 E5M2 to f32: bias 15, IEEE-like (Inf 0x7C/0xFC, NaNs, subnormals); it is the high byte of an f16.
constexpr float f8_e5m2_to_f32(std::uint8_t b) noexcept { return f32_from_bits(formats::f8_e5m2_to_f32(b)); }

/// OCP MX scale E8M0 to f32: 2^(e-127), unsigned, no zero; 0xFF is NaN and 0x00 is the f32 subnormal 2^-127.
constexpr float f8_e8m0_to_f32(std::uint8_t b) noexcept { return f32_from_bits(formats::f8_e8m0_to_f32(b)); }

}  // namespace eredu::cpu
