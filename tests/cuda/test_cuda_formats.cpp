// The CUDA backend's element conversions (eredu/cuda/float_formats.hpp), host instantiation,
// held bit for bit to the CPU backend: exhaustively for every 8- and 16-bit input, and for
// f32 inputs over every rounding boundary plus dense and random sweeps. The kernels call
// these same functions on the device, so these tests need no GPU.

#include "eredu/cuda/float_formats.hpp"

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "eredu/cpu/convert.hpp"
#include "eredu/cpu/float_formats.hpp"
#include "eredu/cuda/kernels.hpp"

using namespace eredu;
namespace f = eredu::cuda::formats;

namespace {

std::uint32_t bits(float v) {
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// The CPU backend's buffer kernel applied to every value of `in`, read back as Out patterns.
template <class In, class Out>
std::vector<Out> cpu_convert(DType from, DType to, const std::vector<In>& in) {
  std::vector<Out> out(in.size());
  cpu::convert_serial(from, to, std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(out)));
  return out;
}

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

TEST_CASE("cuda formats – every 16-bit input widens and crosses exactly as on the CPU", "[cuda][formats]") {
  const std::vector<std::uint16_t> all = every_pattern<std::uint16_t>();
  const auto bf16_f32 = cpu_convert<std::uint16_t, std::uint32_t>(DType::BF16, DType::F32, all);
  const auto f16_f32 = cpu_convert<std::uint16_t, std::uint32_t>(DType::F16, DType::F32, all);
  const auto bf16_f16 = cpu_convert<std::uint16_t, std::uint16_t>(DType::BF16, DType::F16, all);
  const auto f16_bf16 = cpu_convert<std::uint16_t, std::uint16_t>(DType::F16, DType::BF16, all);
  std::size_t mismatches = 0;
  for (std::uint16_t h : all) {
    const bool ok = f::bf16_to_f32(h) == bf16_f32[h] && f::bf16_to_f32(h) == bits(cpu::bf16_to_f32(h)) &&
                    f::f16_to_f32(h) == f16_f32[h] && f::f16_to_f32(h) == bits(cpu::f16_to_f32(h)) &&
                    f::f32_to_f16(f::bf16_to_f32(h)) == bf16_f16[h] && f::f32_to_bf16(f::f16_to_f32(h)) == f16_bf16[h];
    if (!ok && ++mismatches <= 5) FAIL_CHECK("16-bit pattern 0x" << std::hex << h << " differs from the CPU backend");
  }
  CHECK(mismatches == 0);
}

TEST_CASE("cuda formats – every FP8 input widens exactly as on the CPU", "[cuda][formats]") {
  const std::vector<std::uint8_t> all = every_pattern<std::uint8_t>();
  struct Case {
    DType dtype;
    std::uint32_t (*to_f32)(std::uint8_t) noexcept;
    float (*cpu_to_f32)(std::uint8_t) noexcept;
  };
  const Case cases[] = {{DType::F8_E4M3, f::f8_e4m3_to_f32, cpu::f8_e4m3_to_f32},
                        {DType::F8_E5M2, f::f8_e5m2_to_f32, cpu::f8_e5m2_to_f32},
                        {DType::F8_E8M0, f::f8_e8m0_to_f32, cpu::f8_e8m0_to_f32}};
  for (const Case& c : cases) {
    INFO(dtype_name(c.dtype));
    const auto to_f32 = cpu_convert<std::uint8_t, std::uint32_t>(c.dtype, DType::F32, all);
    const auto to_bf16 = cpu_convert<std::uint8_t, std::uint16_t>(c.dtype, DType::BF16, all);
    for (std::uint8_t b : all) {
      INFO("pattern " << int(b));
      REQUIRE(c.to_f32(b) == to_f32[b]);
      REQUIRE(c.to_f32(b) == bits(c.cpu_to_f32(b)));
      REQUIRE(f::f32_to_bf16(c.to_f32(b)) == to_bf16[b]);
    }
  }
}

TEST_CASE("cuda formats – f32 narrowing rounds exactly as on the CPU", "[cuda][formats]") {
  const std::vector<std::uint32_t> patterns = f32_patterns();
  const auto to_bf16 = cpu_convert<std::uint32_t, std::uint16_t>(DType::F32, DType::BF16, patterns);
  const auto to_f16 = cpu_convert<std::uint32_t, std::uint16_t>(DType::F32, DType::F16, patterns);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    const std::uint32_t x = patterns[i];
    float v = 0;
    std::memcpy(&v, &x, sizeof v);
    const bool ok = f::f32_to_bf16(x) == to_bf16[i] && f::f32_to_f16(x) == to_f16[i] &&
                    f::f32_to_bf16(x) == cpu::f32_to_bf16(v) && f::f32_to_f16(x) == cpu::f32_to_f16(v);
    if (!ok && ++mismatches <= 5) FAIL_CHECK("f32 pattern 0x" << std::hex << x << " differs from the CPU backend");
  }
  CHECK(mismatches == 0);
}

TEST_CASE("cuda formats – the backend converts exactly the casts the CPU backend does", "[cuda][formats]") {
  for (std::size_t a = 0; a < dtype_count; ++a)
    for (std::size_t b = 0; b < dtype_count; ++b) {
      const auto from = static_cast<DType>(a), to = static_cast<DType>(b);
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      CHECK(cuda::convert_supported(from, to) == cpu::convert_supported(from, to));
    }
}
