#pragma once
// The float formats by their definitions, for tests: decoders that build each value from its
// fields in double arithmetic with std::ldexp (no bit tricks), and round-to-nearest-even by
// brute search over a format's sorted values. They share no code with the reference
// (eredu/core/float_formats.hpp) or the CPU kernels, so the reference and every kernel can be
// held to them: tests/cpu/test_convert.cpp and tests/cuda/test_cuda_formats.cpp both do.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace eredu::test {

/// True when the f32 pattern `x` is a NaN.
inline bool is_nan32(std::uint32_t x) { return (x & 0x7FFF'FFFFu) > 0x7F80'0000u; }

/// A binary float format with an implicit leading one, IEEE-style subnormals and an
/// all-ones exponent for Inf/NaN.
struct Format {
  int mant_bits;
  int exp_bits;
  int bias;
};
/// bfloat16: f32's exponent, 7 mantissa bits.
inline constexpr Format bf16_format{7, 8, 127};
/// IEEE binary16.
inline constexpr Format f16_format{10, 5, 15};

/// Value of the non-negative pattern `k` of `f` (k may be the all-ones-exponent pattern with
/// zero mantissa, which this returns as 2^(emax+1), the point where rounding overflows).
inline double decode_positive(Format f, std::uint32_t k) {
  const std::uint32_t e = k >> f.mant_bits;
  const std::uint32_t m = k & ((1u << f.mant_bits) - 1u);
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - f.bias - f.mant_bits);
  return std::ldexp(static_cast<double>(m + (1u << f.mant_bits)), static_cast<int>(e) - f.bias - f.mant_bits);
}

/// NaN as a double, or the signed decoded value, of a full IEEE-style pattern.
inline double decode_ieee(Format f, std::uint32_t bits) {
  const std::uint32_t sign_bit = 1u << (f.mant_bits + f.exp_bits);
  const std::uint32_t magnitude = bits & (sign_bit - 1u);
  const std::uint32_t inf = ((1u << f.exp_bits) - 1u) << f.mant_bits;
  double v = 0;
  if (magnitude > inf)
    v = std::nan("");
  else if (magnitude == inf)
    v = INFINITY;
  else
    v = decode_positive(f, magnitude);
  return (bits & sign_bit) != 0 ? -v : v;
}

/// OCP FP8 E4M3 ("FN"): bias 7, no infinities, S.1111.111 is NaN.
inline double decode_e4m3(std::uint8_t b) {
  const double s = (b & 0x80) != 0 ? -1.0 : 1.0;
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::nan("");
  if (e == 0) return s * std::ldexp(m / 8.0, -6);
  return s * std::ldexp(1.0 + m / 8.0, e - 7);
}

/// OCP FP8 E5M2: bias 15, IEEE-style Inf and NaN.
inline double decode_e5m2(std::uint8_t b) {
  const double s = (b & 0x80) != 0 ? -1.0 : 1.0;
  const int e = (b >> 2) & 0x1F, m = b & 3;
  if (e == 31) return m == 0 ? s * INFINITY : std::nan("");
  if (e == 0) return s * std::ldexp(m / 4.0, -14);
  return s * std::ldexp(1.0 + m / 4.0, e - 15);
}

/// OCP MX scale E8M0: 2^(e-127), 0xFF is NaN.
inline double decode_e8m0(std::uint8_t b) { return b == 0xFF ? std::nan("") : std::ldexp(1.0, b - 127); }

/// True when the f32 `got` is exactly `want` (a double), NaN matching any NaN.
inline bool same_value(float got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return static_cast<double>(got) == want && std::signbit(got) == std::signbit(want);
}

/// same_value() for an f32 given as its bit pattern.
inline bool same_value_bits(std::uint32_t got, double want) {
  float v = 0;
  std::memcpy(&v, &got, sizeof v);
  return same_value(v, want);
}

/// The format's non-negative finite values in pattern order, plus 2^(emax+1) at the Inf
/// pattern: the values are increasing, so nearest-even rounding is a search plus a compare.
inline std::vector<double> positive_grid(Format f) {
  const std::uint32_t inf = ((1u << f.exp_bits) - 1u) << f.mant_bits;
  std::vector<double> grid(inf + 1);
  for (std::uint32_t k = 0; k <= inf; ++k) grid[k] = decode_positive(f, k);
  return grid;
}

/// The pattern an f32 rounds to in `f`, by brute definition of round-to-nearest-even; a NaN
/// becomes a quiet NaN of the same sign keeping the payload's high bits.
inline std::uint32_t reference_round(Format f, const std::vector<double>& grid, std::uint32_t x) {
  const std::uint32_t sign = (x >> 31) << (f.mant_bits + f.exp_bits);
  const auto inf = static_cast<std::uint32_t>(grid.size() - 1);
  if (is_nan32(x)) {
    const std::uint32_t payload = (x & 0x7F'FFFFu) >> (23 - f.mant_bits);
    return sign | inf | (1u << (f.mant_bits - 1)) | payload;
  }
  float fx = 0;
  std::memcpy(&fx, &x, sizeof fx);
  const double a = std::fabs(static_cast<double>(fx));
  if (a >= grid.back()) return sign | inf;  // Inf and every finite value past the halfway point
  const auto k = static_cast<std::uint32_t>(std::upper_bound(grid.begin(), grid.end(), a) - grid.begin() - 1);
  const double below = a - grid[k], above = grid[k + 1] - a;
  std::uint32_t r = k;
  if (above < below || (above == below && k % 2 == 1)) r = k + 1;
  return sign | r;
}

}  // namespace eredu::test
