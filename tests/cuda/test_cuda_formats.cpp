// The float-format reference (eredu/core/float_formats.hpp) as the CUDA kernels use it. The
// kernels call these same functions on the device, so this host instantiation is what runs
// there, and these tests need no GPU. The reference is shared with the CPU backend, so it is
// compared here with code that shares nothing with it: the formats' definitions
// (support/float_definitions.hpp: double decoders, brute-force nearest-even rounding) and the
// CPU backend's separately written buffer kernels (generic and AVX2), for every 8- and 16-bit
// input and millions of f32 ones. Then: its results do not move under flush-to-zero and
// denormals-are-zero (the device's float modes), and the kernels' cast table is
// eredu::is_supported_cast.

#include "eredu/core/float_formats.hpp"

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "eredu/cpu/convert.hpp"
#include "eredu/cuda/kernels.hpp"
#include "support/float_definitions.hpp"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

using namespace eredu;
namespace f = eredu::formats;
namespace def = eredu::test;

namespace {

// The CPU backend's buffer kernel (the `isa` set) applied to every value of `in`, read back
// as Out patterns.
template <class In, class Out>
std::vector<Out> cpu_convert(cpu::ConvertIsa isa, DType from, DType to, const std::vector<In>& in) {
  cpu::use_convert_isa(isa);
  std::vector<Out> out(in.size());
  cpu::convert_serial(from, to, std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(out)));
  cpu::use_convert_isa(cpu::ConvertIsa::best);
  return out;
}

const auto all_isas = {cpu::ConvertIsa::best, cpu::ConvertIsa::generic};

template <class T>
std::vector<T> every_pattern() {
  std::vector<T> v(std::size_t{1} << (8 * sizeof(T)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(i);
  return v;
}

// f32 patterns: every 2^16-spaced high half with low halves on, next to and at the bf16
// (bit 15) and f16 (bit 12) rounding points; every 251st pattern of the whole space; and
// random patterns in and around the f16 range.
std::vector<std::uint32_t> f32_patterns() {
  const std::array<std::uint32_t, 12> lows{0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000,
                                           0x3000, 0x7FFF, 0x8000, 0x8001, 0xE000, 0xFFFF};
  std::vector<std::uint32_t> v;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : lows) v.push_back(hi << 16 | lo);
  for (std::uint64_t x = 0; x <= 0xFFFF'FFFFu; x += 251) v.push_back(static_cast<std::uint32_t>(x));
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_int_distribution<std::uint32_t> exponent(90, 146);
  for (int i = 0; i < 1'000'000; ++i) v.push_back((any(rng) & 0x807F'FFFFu) | exponent(rng) << 23);
  return v;
}

// A NaN widened to f32 by the definition: same sign, quiet bit set, payload moved to the top
// of the f32 mantissa (bf16 keeps every bit, so only f16 and FP8 E5M2 go through this).
std::uint32_t quiet_f32_nan(std::uint32_t sign, std::uint32_t payload, int payload_bits) {
  return sign << 31 | 0x7FC0'0000u | payload << (23 - payload_bits);
}

// Every conversion of the reference, over every 8- and 16-bit input and `f32` (narrowed to
// bf16 and f16), concatenated in one vector of bit patterns.
std::vector<std::uint32_t> reference_results(const std::vector<std::uint32_t>& f32) {
  std::vector<std::uint32_t> r;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    r.insert(r.end(), {f::bf16_to_f32(h), f::f16_to_f32(h), f::bf16_to_f16(h), f::f16_to_bf16(h)});
  }
  for (std::uint32_t i = 0; i < 256; ++i) {
    const auto b = static_cast<std::uint8_t>(i);
    r.insert(r.end(), {f::f8_e4m3_to_f32(b), f::f8_e5m2_to_f32(b), f::f8_e8m0_to_f32(b), f::f8_e4m3_to_bf16(b),
                       f::f8_e5m2_to_bf16(b), f::f8_e8m0_to_bf16(b)});
  }
  for (std::uint32_t x : f32) r.insert(r.end(), {f::f32_to_bf16(x), f::f32_to_f16(x)});
  return r;
}

#if defined(__x86_64__)
// Runs reference_results with flush-to-zero and denormals-are-zero set in MXCSR, restoring
// the caller's mode after. Not inlined, so no computation moves across the mode switch.
[[gnu::noinline]] std::vector<std::uint32_t> reference_results_ftz_daz(const std::vector<std::uint32_t>& f32) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
  std::vector<std::uint32_t> r = reference_results(f32);
  _mm_setcsr(saved);
  return r;
}
#endif

}  // namespace

TEST_CASE("cuda formats – known values, at compile time", "[cuda][formats]") {
  STATIC_REQUIRE(f::f8_e4m3_to_f32(0x7E) == 0x43E0'0000u);  // 448
  STATIC_REQUIRE(f::f8_e4m3_to_f32(0x01) == 0x3B00'0000u);  // 2^-9
  STATIC_REQUIRE(f::f8_e4m3_to_f32(0x80) == 0x8000'0000u);  // -0
  STATIC_REQUIRE(f::f8_e5m2_to_f32(0x7C) == 0x7F80'0000u);  // Inf
  STATIC_REQUIRE(f::f8_e8m0_to_f32(0x7F) == 0x3F80'0000u);  // 1
  STATIC_REQUIRE(f::f16_to_f32(0x0001) == 0x3380'0000u);    // 2^-24
  STATIC_REQUIRE(f::f32_to_bf16(0x3F80'8000u) == 0x3F80);   // tie to even, down
  STATIC_REQUIRE(f::f32_to_bf16(0x3F81'8000u) == 0x3F82);   // tie to even, up
  STATIC_REQUIRE(f::f32_to_f16(0x477F'F000u) == 0x7C00);    // 65520 rounds to Inf
  STATIC_REQUIRE(f::f32_to_f16(0x7F80'0001u) == 0x7E00);    // a signalling NaN is quieted
}

TEST_CASE("cuda formats – every 16-bit input widens and crosses as the formats define and the CPU kernels compute",
          "[cuda][formats]") {
  const std::vector<std::uint16_t> all = every_pattern<std::uint16_t>();
  const auto f16_grid = def::positive_grid(def::f16_format);
  const auto bf16_grid = def::positive_grid(def::bf16_format);
  std::size_t mismatches = 0;
  for (std::uint16_t h : all) {
    const std::uint32_t sign = h >> 15, mant = h & 0x3FFu;
    const bool f16_nan = (h & 0x7FFFu) > 0x7C00u;
    // Widening: the decoded value exactly, and a NaN's bits by the definition.
    bool ok = def::same_value_bits(f::bf16_to_f32(h), def::decode_ieee(def::bf16_format, h)) &&
              f::bf16_to_f32(h) == std::uint32_t{h} << 16 &&
              def::same_value_bits(f::f16_to_f32(h), def::decode_ieee(def::f16_format, h)) &&
              (!f16_nan || f::f16_to_f32(h) == quiet_f32_nan(sign, mant, 10));
    // Crossing rounds once, from the exact f32 value.
    ok = ok && f::bf16_to_f16(h) == def::reference_round(def::f16_format, f16_grid, f::bf16_to_f32(h)) &&
         f::f16_to_bf16(h) == def::reference_round(def::bf16_format, bf16_grid, f::f16_to_f32(h));
    if (!ok && ++mismatches <= 5) FAIL_CHECK("16-bit pattern 0x" << std::hex << h << " differs from the definition");
  }
  CHECK(mismatches == 0);
  for (cpu::ConvertIsa isa : all_isas) {
    INFO((isa == cpu::ConvertIsa::best ? "best CPU kernels" : "generic CPU kernels"));
    const auto bf16_f32 = cpu_convert<std::uint16_t, std::uint32_t>(isa, DType::BF16, DType::F32, all);
    const auto f16_f32 = cpu_convert<std::uint16_t, std::uint32_t>(isa, DType::F16, DType::F32, all);
    const auto bf16_f16 = cpu_convert<std::uint16_t, std::uint16_t>(isa, DType::BF16, DType::F16, all);
    const auto f16_bf16 = cpu_convert<std::uint16_t, std::uint16_t>(isa, DType::F16, DType::BF16, all);
    std::size_t differ = 0;
    for (std::uint16_t h : all) {
      const bool ok = f::bf16_to_f32(h) == bf16_f32[h] && f::f16_to_f32(h) == f16_f32[h] &&
                      f::bf16_to_f16(h) == bf16_f16[h] && f::f16_to_bf16(h) == f16_bf16[h];
      if (!ok && ++differ <= 5) FAIL_CHECK("16-bit pattern 0x" << std::hex << h << " differs from the CPU kernels");
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("cuda formats – every FP8 input widens as its format defines", "[cuda][formats]") {
  struct Case {
    DType dtype;
    std::uint32_t (*to_f32)(std::uint8_t) noexcept;
    std::uint16_t (*to_bf16)(std::uint8_t) noexcept;
    double (*decode)(std::uint8_t);
  };
  const Case cases[] = {{DType::F8_E4M3, f::f8_e4m3_to_f32, f::f8_e4m3_to_bf16, def::decode_e4m3},
                        {DType::F8_E5M2, f::f8_e5m2_to_f32, f::f8_e5m2_to_bf16, def::decode_e5m2},
                        {DType::F8_E8M0, f::f8_e8m0_to_f32, f::f8_e8m0_to_bf16, def::decode_e8m0}};
  const auto bf16_grid = def::positive_grid(def::bf16_format);
  for (const Case& c : cases) {
    INFO(dtype_name(c.dtype));
    for (std::uint32_t i = 0; i < 256; ++i) {
      const auto b = static_cast<std::uint8_t>(i);
      INFO("pattern " << i);
      const double want = c.decode(b);
      REQUIRE(def::same_value_bits(c.to_f32(b), want));
      if (std::isnan(want)) {
        // E4M3 and E8M0 have one NaN per sign: the canonical quiet NaN. E5M2 is an f16's
        // high byte: quieted, payload kept.
        const std::uint32_t sign = c.dtype == DType::F8_E8M0 ? 0u : i >> 7;
        REQUIRE(c.to_f32(b) ==
                (c.dtype == DType::F8_E5M2 ? quiet_f32_nan(sign, i & 3u, 2) : sign << 31 | 0x7FC0'0000u));
      }
      // Every FP8 value is exact in bf16: the nearest-even bf16 of the f32 value, which
      // widens back to it.
      REQUIRE(c.to_bf16(b) == def::reference_round(def::bf16_format, bf16_grid, c.to_f32(b)));
      if (!std::isnan(want)) REQUIRE(f::bf16_to_f32(c.to_bf16(b)) == c.to_f32(b));
    }
  }
}

TEST_CASE("cuda formats – f32 narrowing rounds as brute force and the CPU kernels do", "[cuda][formats]") {
  const std::vector<std::uint32_t> patterns = f32_patterns();
  const auto bf16_grid = def::positive_grid(def::bf16_format);
  const auto f16_grid = def::positive_grid(def::f16_format);
  std::size_t mismatches = 0;
  for (std::uint32_t x : patterns) {
    const bool ok = f::f32_to_bf16(x) == def::reference_round(def::bf16_format, bf16_grid, x) &&
                    f::f32_to_f16(x) == def::reference_round(def::f16_format, f16_grid, x);
    if (!ok && ++mismatches <= 5) FAIL_CHECK("f32 pattern 0x" << std::hex << x << " differs from brute force");
  }
  CHECK(mismatches == 0);
  for (cpu::ConvertIsa isa : all_isas) {
    INFO((isa == cpu::ConvertIsa::best ? "best CPU kernels" : "generic CPU kernels"));
    const auto to_bf16 = cpu_convert<std::uint32_t, std::uint16_t>(isa, DType::F32, DType::BF16, patterns);
    const auto to_f16 = cpu_convert<std::uint32_t, std::uint16_t>(isa, DType::F32, DType::F16, patterns);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      const std::uint32_t x = patterns[i];
      const bool ok = f::f32_to_bf16(x) == to_bf16[i] && f::f32_to_f16(x) == to_f16[i];
      if (!ok && ++differ <= 5) FAIL_CHECK("f32 pattern 0x" << std::hex << x << " differs from the CPU kernels");
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("cuda formats – results do not move under flush-to-zero and denormals-are-zero", "[cuda][formats]") {
#if defined(__x86_64__)
  // The device may flush subnormals in float arithmetic; the host's MXCSR modes do the same
  // to SSE arithmetic. An integer-only reference gives the same bits either way — among
  // them the subnormal results of f16 and E8M0 widening and bf16 narrowing of f32 subnormals.
  std::vector<std::uint32_t> f32 = f32_patterns();
  for (std::uint32_t m = 1; m < 0x80'0000u; m += 97) f32.insert(f32.end(), {m, 0x8000'0000u | m});
  const std::vector<std::uint32_t> normal = reference_results(f32);
  const std::vector<std::uint32_t> flushed = reference_results_ftz_daz(f32);
  REQUIRE(normal.size() == flushed.size());
  std::size_t moved = 0;
  for (std::size_t i = 0; i < normal.size(); ++i) moved += normal[i] != flushed[i] ? 1 : 0;
  CHECK(moved == 0);
#else
  WARN("not an x86-64 host: no MXCSR to set flush-to-zero with; skipping");
#endif
}

TEST_CASE("cuda formats – the kernels convert exactly the casts the float formats define", "[cuda][formats]") {
  for (std::size_t a = 0; a < dtype_count; ++a)
    for (std::size_t b = 0; b < dtype_count; ++b) {
      const auto from = static_cast<DType>(a), to = static_cast<DType>(b);
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      CHECK(cuda::convert_supported(from, to) == is_supported_cast(from, to));
      CHECK(cpu::convert_supported(from, to) == is_supported_cast(from, to));
    }
}
