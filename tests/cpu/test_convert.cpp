// Tests of the CPU backend's dtype conversions: the one float-format reference
// (eredu/core/float_formats.hpp, through the CPU's float-typed view) against independent
// double-arithmetic decoders and rounding (support/float_definitions.hpp), and the buffer
// kernels (serial and parallel, aligned and not, AVX2 and generic) against the reference,
// exhaustively for every 8- and 16-bit input.
#include "eredu/cpu/convert.hpp"

#include <catch2/catch.hpp>

#include <tbb/task_arena.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/core/float_formats.hpp"
#include "eredu/cpu/float_formats.hpp"
#include "support/float_definitions.hpp"

using namespace eredu;
using namespace eredu::cpu;
using namespace eredu::test;

namespace {

#ifdef NDEBUG
constexpr std::size_t random_f32_samples = 3'000'000;
#else
constexpr std::size_t random_f32_samples = 200'000;  // sanitized Debug builds are ~20x slower
#endif

template <class T>
std::vector<std::byte> to_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class T>
std::vector<T> from_bytes(std::span<const std::byte> b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// "" when equal, otherwise where the first difference is: Catch would print whole
// megabyte buffers for a failed ==.
std::string difference(std::span<const std::byte> got, std::span<const std::byte> want) {
  if (got.size() != want.size())
    return "got " + std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  const auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
  if (g == got.end()) return "";
  return "first difference at byte " + std::to_string(g - got.begin()) + " of " + std::to_string(got.size());
}

enum class Runner { serial, parallel, serial_unaligned, parallel_unaligned };

// Runs one conversion through the chosen entry point; the unaligned runners shift both
// buffers off any natural alignment (input by 1 byte, output by 3).
std::vector<std::byte> run(Runner how, DType from, DType to, const std::vector<std::byte>& in, std::size_t out_size) {
  const bool unaligned = how == Runner::serial_unaligned || how == Runner::parallel_unaligned;
  const bool parallel = how == Runner::parallel || how == Runner::parallel_unaligned;
  const std::size_t in_shift = unaligned ? 1 : 0, out_shift = unaligned ? 3 : 0;
  std::vector<std::byte> in_buf(in.size() + in_shift), out_buf(out_size + out_shift);
  std::copy(in.begin(), in.end(), in_buf.begin() + static_cast<std::ptrdiff_t>(in_shift));
  std::span<const std::byte> src = std::span<const std::byte>(in_buf).subspan(in_shift);
  std::span<std::byte> dst = std::span<std::byte>(out_buf).subspan(out_shift);
  if (parallel)
    convert(from, to, src, dst);
  else
    convert_serial(from, to, src, dst);
  return {dst.begin(), dst.end()};
}

const auto all_runners = {Runner::serial, Runner::parallel, Runner::serial_unaligned, Runner::parallel_unaligned};

// Both kernel sets must give the reference's bits: the exhaustive tests run each.
const auto all_isas = {ConvertIsa::best, ConvertIsa::generic};

const char* isa_name(ConvertIsa isa) { return isa == ConvertIsa::best ? "best kernels" : "generic kernels"; }

// Selects a kernel set for the rest of a test and restores the default at its end.
struct IsaScope {
  explicit IsaScope(ConvertIsa isa) { use_convert_isa(isa); }
  ~IsaScope() { use_convert_isa(ConvertIsa::best); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

const char* runner_name(Runner r) {
  switch (r) {
    case Runner::serial:
      return "serial";
    case Runner::parallel:
      return "parallel";
    case Runner::serial_unaligned:
      return "serial unaligned";
    case Runner::parallel_unaligned:
      return "parallel unaligned";
  }
  return "?";
}

std::uint32_t bits_of(float v) {
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

float float_of(std::uint32_t b) {
  float v = 0;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

std::vector<std::uint16_t> all_16bit() {
  std::vector<std::uint16_t> v(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<std::uint16_t>(i);
  return v;
}

std::vector<std::uint8_t> all_8bit() {
  std::vector<std::uint8_t> v(256);
  for (std::uint32_t i = 0; i < 256; ++i) v[i] = static_cast<std::uint8_t>(i);
  return v;
}

// f32 patterns for narrowing: every 2^16-spaced pattern with low halves that sit on, just
// off, and exactly at the rounding points of bf16 (bit 15) and f16 (bit 12), then random
// patterns, half uniform over all bits and half in the f16 range and just below it.
std::vector<std::uint32_t> f32_patterns() {
  const std::array<std::uint32_t, 12> lows{0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000,
                                           0x3000, 0x7FFF, 0x8000, 0x8001, 0xE000, 0xFFFF};
  std::vector<std::uint32_t> v;
  v.reserve(65536 * lows.size() + random_f32_samples);
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : lows) v.push_back(hi << 16 | lo);
  std::mt19937 rng(20260713);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_int_distribution<std::uint32_t> exponent(90, 146);  // f16 underflow .. overflow
  for (std::size_t i = 0; i < random_f32_samples; ++i) {
    const std::uint32_t r = any(rng);
    v.push_back(i % 2 == 0 ? r : (r & 0x807F'FFFFu) | exponent(rng) << 23);
  }
  return v;
}

}  // namespace

TEST_CASE("float formats – known values", "[cpu][convert][scalar]") {
  STATIC_REQUIRE(f8_e4m3_to_f32(0x7E) == 448.0f);
  STATIC_REQUIRE(f8_e4m3_to_f32(0x01) == 0x1p-9f);
  STATIC_REQUIRE(f8_e5m2_to_f32(0x7B) == 57344.0f);
  STATIC_REQUIRE(f8_e8m0_to_f32(0x7F) == 1.0f);
  STATIC_REQUIRE(f8_e8m0_to_f32(0x00) == 0x1p-127f);
  STATIC_REQUIRE(bf16_to_f32(0x3F80) == 1.0f);
  STATIC_REQUIRE(f16_to_f32(0x3C00) == 1.0f);

  CHECK(f8_e4m3_to_f32(0xFE) == -448.0f);
  CHECK(f8_e4m3_to_f32(0x08) == 0x1p-6f);    // smallest normal
  CHECK(f8_e4m3_to_f32(0x07) == 0x1.cp-7f);  // largest subnormal, 7 x 2^-9
  CHECK(std::isnan(f8_e4m3_to_f32(0x7F)));
  CHECK(std::isnan(f8_e4m3_to_f32(0xFF)));
  CHECK(bits_of(f8_e4m3_to_f32(0x80)) == 0x8000'0000u);
  CHECK(f8_e4m3_to_f32(0x78) == 256.0f);  // e = 15 is a normal binade in E4M3FN, not Inf

  CHECK(f8_e5m2_to_f32(0x7C) == INFINITY);
  CHECK(f8_e5m2_to_f32(0xFC) == -INFINITY);
  CHECK(std::isnan(f8_e5m2_to_f32(0x7D)));
  CHECK(std::isnan(f8_e5m2_to_f32(0xFF)));
  CHECK(f8_e5m2_to_f32(0x01) == 0x1p-16f);
  CHECK(f8_e5m2_to_f32(0xFB) == -57344.0f);

  CHECK(bits_of(f8_e8m0_to_f32(0x00)) == 0x0040'0000u);  // exact, not flushed
  CHECK(f8_e8m0_to_f32(0x80) == 2.0f);
  CHECK(f8_e8m0_to_f32(0xFE) == 0x1p127f);
  CHECK(f8_e8m0_to_f32(0x01) == 0x1p-126f);
  CHECK(std::isnan(f8_e8m0_to_f32(0xFF)));

  CHECK(f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(f16_to_f32(0x03FF) == 0x1.ff8p-15f);
  CHECK(f16_to_f32(0x0400) == 0x1p-14f);
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_to_f32(0xFC00) == -INFINITY);
  CHECK(bits_of(f16_to_f32(0x7C01)) == 0x7FC0'2000u);   // signalling NaN quieted, payload kept
  CHECK(bits_of(bf16_to_f32(0x7F81)) == 0x7F81'0000u);  // bf16 widening keeps every bit
}

TEST_CASE("float formats – every 8- and 16-bit pattern decodes as the format defines", "[cpu][convert][scalar]") {
  for (std::uint32_t i = 0; i < 256; ++i) {
    const auto b = static_cast<std::uint8_t>(i);
    INFO("pattern 0x" << std::hex << i);
    CHECK(same_value(f8_e4m3_to_f32(b), decode_e4m3(b)));
    CHECK(same_value(f8_e5m2_to_f32(b), decode_e5m2(b)));
    CHECK(same_value(f8_e8m0_to_f32(b), decode_e8m0(b)));
  }
  std::size_t bad_f16 = 0, bad_bf16 = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    if (!same_value(f16_to_f32(h), decode_ieee(f16_format, h))) ++bad_f16;
    if (!same_value(bf16_to_f32(h), decode_ieee(bf16_format, h))) ++bad_bf16;
  }
  CHECK(bad_f16 == 0);
  CHECK(bad_bf16 == 0);
}

TEST_CASE("float formats – f32 narrowing matches brute-force nearest-even rounding", "[cpu][convert][scalar]") {
  const auto bf16_grid = positive_grid(bf16_format);
  const auto f16_grid = positive_grid(f16_format);
  const auto patterns = f32_patterns();
  std::size_t bad_bf16 = 0, bad_f16 = 0;
  std::uint32_t first_bad_bf16 = 0, first_bad_f16 = 0;
  for (std::uint32_t x : patterns) {
    if (f32_to_bf16(float_of(x)) != reference_round(bf16_format, bf16_grid, x) && bad_bf16++ == 0) first_bad_bf16 = x;
    if (f32_to_f16(float_of(x)) != reference_round(f16_format, f16_grid, x) && bad_f16++ == 0) first_bad_f16 = x;
  }
  INFO("first bad bf16 input 0x" << std::hex << first_bad_bf16 << ", first bad f16 input 0x" << first_bad_f16);
  CHECK(bad_bf16 == 0);
  CHECK(bad_f16 == 0);
}

TEST_CASE("float formats – narrowing edge cases", "[cpu][convert][scalar]") {
  // ties to even
  CHECK(f32_to_bf16(float_of(0x3F80'8000u)) == 0x3F80);  // tie, 0x3F80 even: down
  CHECK(f32_to_bf16(float_of(0x3F81'8000u)) == 0x3F82);  // tie, 0x3F81 odd: up
  CHECK(f32_to_bf16(float_of(0x3F80'8001u)) == 0x3F81);
  CHECK(f32_to_f16(1.0f + 0x1p-11f) == 0x3C00);             // tie at half an f16 ulp: even
  CHECK(f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3C02);         // tie above an odd mantissa: up
  CHECK(f32_to_f16(1.0f + 0x1p-11f + 0x1p-23f) == 0x3C01);  // just past the tie
  // largest finite value and the overflow boundary
  CHECK(f32_to_bf16(float_of(0x7F7F'7FFFu)) == 0x7F7F);
  CHECK(f32_to_bf16(float_of(0x7F7F'8000u)) == 0x7F80);  // tie above the odd largest finite: Inf
  CHECK(f32_to_bf16(float_of(0x7F7F'FFFFu)) == 0x7F80);  // FLT_MAX rounds to Inf
  CHECK(f32_to_bf16(float_of(0xFF7F'FFFFu)) == 0xFF80);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);
  CHECK(f32_to_f16(-65520.0f) == 0xFC00);
  CHECK(f32_to_f16(1e10f) == 0x7C00);
  // subnormal results and rounding into and out of the subnormal range
  CHECK(f32_to_f16(0x1p-24f) == 0x0001);
  CHECK(f32_to_f16(0x1p-25f) == 0x0000);  // tie with 0: even
  CHECK(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(f32_to_f16(-0x1.8p-25f) == 0x8001);
  CHECK(f32_to_f16(0x1.8p-24f) == 0x0002);    // 1.5 units: tie, up to even 2
  CHECK(f32_to_f16(0x1.4p-23f) == 0x0002);    // 2.5 units: tie, down to even 2
  CHECK(f32_to_f16(0x3FFp-24f) == 0x03FF);    // largest subnormal
  CHECK(f32_to_f16(0x3FF.8p-24f) == 0x0400);  // tie above it: the smallest normal
  CHECK(f32_to_f16(0x1p-14f) == 0x0400);
  CHECK(f32_to_f16(0x1p-30f) == 0x0000);
  CHECK(f32_to_f16(float_of(0x0000'0001u)) == 0x0000);  // f32 subnormal
  CHECK(f32_to_bf16(float_of(0x0000'0001u)) == 0x0000);
  CHECK(f32_to_bf16(float_of(0x0000'8001u)) == 0x0001);  // bf16 subnormal, rounded up
  CHECK(f32_to_bf16(float_of(0x007F'FFFFu)) == 0x0080);  // largest f32 subnormal to smallest normal
  // NaN: quiet, sign kept, never Inf
  CHECK(f32_to_bf16(float_of(0x7F80'0001u)) == 0x7FC0);
  CHECK(f32_to_bf16(float_of(0xFF80'0001u)) == 0xFFC0);
  CHECK(f32_to_bf16(float_of(0x7FFF'FFFFu)) == 0x7FFF);
  CHECK(f32_to_bf16(float_of(0x7FA0'0000u)) == 0x7FE0);
  CHECK(f32_to_f16(float_of(0x7F80'0001u)) == 0x7E00);
  CHECK(f32_to_f16(float_of(0xFF80'0001u)) == 0xFE00);
  CHECK(f32_to_f16(float_of(0x7FBF'E000u)) == 0x7FFF);
  // zeros and infinities
  CHECK(f32_to_bf16(0.0f) == 0x0000);
  CHECK(f32_to_bf16(-0.0f) == 0x8000);
  CHECK(f32_to_f16(0.0f) == 0x0000);
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f32_to_bf16(INFINITY) == 0x7F80);
  CHECK(f32_to_bf16(-INFINITY) == 0xFF80);
  CHECK(f32_to_f16(INFINITY) == 0x7C00);
  CHECK(f32_to_f16(-INFINITY) == 0xFC00);
}

TEST_CASE("convert – every bf16 and f16 value widens to f32 and narrows back as the scalar reference does",
          "[cpu][convert][exhaustive]") {
  const auto halves = all_16bit();
  const auto in = to_bytes(halves);
  for (ConvertIsa isa : all_isas)
    for (Runner how : all_runners) {
      IsaScope scope(isa);
      INFO(isa_name(isa) << ", " << runner_name(how));
      for (DType t : {DType::BF16, DType::F16}) {
        INFO(dtype_name(t));
        const auto f32 = from_bytes<std::uint32_t>(run(how, t, DType::F32, in, in.size() * 2));
        std::size_t bad_widen = 0, bad_narrow = 0, bad_round_trip = 0;
        std::vector<std::uint16_t> expected_back(65536);
        for (std::uint32_t i = 0; i < 65536; ++i) {
          const auto h = static_cast<std::uint16_t>(i);
          const float want = t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
          if (f32[i] != bits_of(want)) ++bad_widen;
          expected_back[i] = t == DType::BF16 ? f32_to_bf16(want) : f32_to_f16(want);
          if (!is_nan32(f32[i]) && expected_back[i] != h) ++bad_round_trip;
        }
        const auto back = from_bytes<std::uint16_t>(run(how, DType::F32, t, to_bytes(f32), in.size()));
        for (std::uint32_t i = 0; i < 65536; ++i)
          if (back[i] != expected_back[i]) ++bad_narrow;
        CHECK(bad_widen == 0);
        CHECK(bad_narrow == 0);
        CHECK(bad_round_trip == 0);
      }
    }
}

TEST_CASE("convert – every bf16 to f16 and f16 to bf16 rounds once through f32", "[cpu][convert][exhaustive]") {
  const auto in = to_bytes(all_16bit());
  for (ConvertIsa isa : all_isas)
    for (Runner how : all_runners) {
      IsaScope scope(isa);
      INFO(isa_name(isa) << ", " << runner_name(how));
      const auto to_f16 = from_bytes<std::uint16_t>(run(how, DType::BF16, DType::F16, in, in.size()));
      const auto to_bf16 = from_bytes<std::uint16_t>(run(how, DType::F16, DType::BF16, in, in.size()));
      std::size_t bad_f16 = 0, bad_bf16 = 0;
      for (std::uint32_t i = 0; i < 65536; ++i) {
        const auto h = static_cast<std::uint16_t>(i);
        if (to_f16[i] != f32_to_f16(bf16_to_f32(h))) ++bad_f16;
        if (to_bf16[i] != f32_to_bf16(f16_to_f32(h))) ++bad_bf16;
      }
      CHECK(bad_f16 == 0);
      CHECK(bad_bf16 == 0);
    }
}

TEST_CASE("convert – every FP8 value widens to f32 and bf16 exactly", "[cpu][convert][exhaustive]") {
  struct Case {
    DType type;
    float (*reference)(std::uint8_t);
  };
  const auto in = to_bytes(all_8bit());
  for (ConvertIsa isa : all_isas)
    for (Runner how : all_runners) {
      IsaScope scope(isa);
      INFO(isa_name(isa) << ", " << runner_name(how));
      for (Case c : {Case{DType::F8_E4M3, f8_e4m3_to_f32}, Case{DType::F8_E5M2, f8_e5m2_to_f32},
                     Case{DType::F8_E8M0, f8_e8m0_to_f32}}) {
        INFO(dtype_name(c.type));
        const auto f32 = from_bytes<std::uint32_t>(run(how, c.type, DType::F32, in, 256 * 4));
        const auto bf16 = from_bytes<std::uint16_t>(run(how, c.type, DType::BF16, in, 256 * 2));
        for (std::uint32_t i = 0; i < 256; ++i) {
          INFO("pattern 0x" << std::hex << i);
          const float want = c.reference(static_cast<std::uint8_t>(i));
          CHECK(f32[i] == bits_of(want));
          CHECK(bf16[i] == f32_to_bf16(want));
          // No FP8 value needs rounding in bf16: widening it back gives the f32 value.
          if (!std::isnan(want))
            CHECK(bf16_to_f32(bf16[i]) == want);
          else
            CHECK(std::isnan(bf16_to_f32(bf16[i])));
        }
      }
    }
}

TEST_CASE("convert – f32 narrowing kernels match brute-force rounding on millions of patterns",
          "[cpu][convert][exhaustive]") {
  const auto patterns = f32_patterns();
  const auto in = to_bytes(patterns);
  const auto bf16_grid = positive_grid(bf16_format);
  const auto f16_grid = positive_grid(f16_format);
  for (ConvertIsa isa : all_isas)
    for (Runner how : {Runner::parallel, Runner::serial_unaligned}) {
      IsaScope scope(isa);
      INFO(isa_name(isa) << ", " << runner_name(how));
      const auto bf16 = from_bytes<std::uint16_t>(run(how, DType::F32, DType::BF16, in, patterns.size() * 2));
      const auto f16 = from_bytes<std::uint16_t>(run(how, DType::F32, DType::F16, in, patterns.size() * 2));
      std::size_t bad_bf16 = 0, bad_f16 = 0;
      for (std::size_t i = 0; i < patterns.size(); ++i) {
        if (bf16[i] != reference_round(bf16_format, bf16_grid, patterns[i])) ++bad_bf16;
        if (f16[i] != reference_round(f16_format, f16_grid, patterns[i])) ++bad_f16;
      }
      CHECK(bad_bf16 == 0);
      CHECK(bad_f16 == 0);
    }
}

TEST_CASE("convert – the supported casts are exactly the documented set", "[cpu][convert][errors]") {
  auto in_set = [](DType t, std::initializer_list<DType> set) {
    return std::find(set.begin(), set.end(), t) != set.end();
  };
  for (std::size_t f = 0; f < dtype_count; ++f) {
    for (std::size_t t = 0; t < dtype_count; ++t) {
      const auto from = static_cast<DType>(f), to = static_cast<DType>(t);
      const bool expected =
          from == to ||
          (in_set(from, {DType::F16, DType::BF16, DType::F32}) && in_set(to, {DType::F16, DType::BF16, DType::F32})) ||
          (in_set(from, {DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0}) && in_set(to, {DType::BF16, DType::F32})) ||
          (dtype_is_quantized(from) && from != DType::Q8_1 && in_set(to, {DType::F16, DType::BF16, DType::F32}));
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      CHECK(convert_supported(from, to) == expected);
      // The one definition recipe inference checks casts against is this same set.
      CHECK(is_supported_cast(from, to) == expected);
      // Eight elements in whole bytes for every dtype (F4: 4 bytes, F6: 6 bytes), or two
      // blocks of a quantized dtype (zero scales: zeros).
      const ConvertUnits units = convert_units(from, to);
      const bool blocks = dtype_is_quantized(from) && from != to;
      std::vector<std::byte> in(blocks ? 2 * units.in_bytes : dtype_bits(from)),
          out(blocks ? 2 * units.out_bytes : dtype_bits(to), std::byte{0x5A});
      if (expected) {
        CHECK_NOTHROW(convert_serial(from, to, in, out));
        CHECK_NOTHROW(convert(from, to, in, out));
      } else {
        for (bool parallel : {false, true}) {
          try {
            parallel ? convert(from, to, in, out) : convert_serial(from, to, in, out);
            FAIL("no exception");
          } catch (const Error& e) {
            CHECK(e.kind() == errc::recipe_unsupported_cast);
            CHECK_THAT(e.what(), Catch::Contains(std::string(dtype_name(from))));
            CHECK_THAT(e.what(), Catch::Contains(std::string(dtype_name(to))));
          }
          CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x5A}; }));
        }
      }
    }
  }
}

TEST_CASE("convert – buffers that do not hold the same whole number of elements are rejected",
          "[cpu][convert][errors]") {
  struct Case {
    DType from, to;
    std::size_t in_bytes, out_bytes;
  };
  std::vector<std::byte> storage(64);
  for (Case c :
       {Case{DType::F32, DType::BF16, 6, 2}, Case{DType::F32, DType::BF16, 8, 2}, Case{DType::BF16, DType::F32, 4, 4},
        Case{DType::BF16, DType::F32, 3, 6}, Case{DType::F8_E4M3, DType::F32, 4, 12},
        Case{DType::F16, DType::BF16, 4, 5}, Case{DType::F32, DType::F32, 8, 12}, Case{DType::F4, DType::F4, 3, 2}}) {
    INFO(dtype_name(c.from) << " -> " << dtype_name(c.to) << ", " << c.in_bytes << " -> " << c.out_bytes);
    const std::vector<std::byte> in(c.in_bytes);
    std::vector<std::byte> out(c.out_bytes, std::byte{0x5A});
    for (bool parallel : {false, true}) {
      try {
        parallel ? convert(c.from, c.to, in, out) : convert_serial(c.from, c.to, in, out);
        FAIL("no exception");
      } catch (const Error& e) {
        CHECK(e.kind() == errc::invalid_argument);
        CHECK_THAT(e.what(), Catch::Contains(std::to_string(c.in_bytes)));
        CHECK_THAT(e.what(), Catch::Contains(std::to_string(c.out_bytes)));
      }
      CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x5A}; }));
    }
  }
  // Overlapping buffers are refused rather than half converted.
  const std::span<std::byte> all(storage);
  CHECK_THROWS_MATCHES(convert_serial(DType::BF16, DType::F32, all.subspan(0, 16), all.subspan(8, 32)), Error,
                       Catch::Predicate<Error>([](const Error& e) { return e.kind() == errc::invalid_argument; }));
  CHECK_THROWS_AS(convert(DType::F32, DType::F32, all.subspan(0, 32), all.subspan(16, 32)), Error);
  CHECK_NOTHROW(convert(DType::F32, DType::F32, all.subspan(0, 32), all.subspan(32, 32)));
  // Empty buffers are a valid, empty conversion.
  CHECK_NOTHROW(convert(DType::F8_E5M2, DType::BF16, {}, {}));
}

TEST_CASE("convert – parallel results equal serial ones at sizes off the block size and unaligned",
          "[cpu][convert][parallel]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<unsigned> byte(0, 255);
  struct Case {
    DType from, to;
  };
  const std::size_t elements = 3 * (convert_block_bytes / 2) + 17;  // not a multiple of any block
  for (Case c : {Case{DType::F32, DType::BF16}, Case{DType::BF16, DType::F32}, Case{DType::F16, DType::F32},
                 Case{DType::F32, DType::F16}, Case{DType::F16, DType::BF16}, Case{DType::F8_E4M3, DType::F32},
                 Case{DType::F8_E5M2, DType::BF16}, Case{DType::F8_E8M0, DType::F32}, Case{DType::BF16, DType::BF16},
                 Case{DType::F6_E2M3, DType::F6_E2M3}}) {
    INFO(dtype_name(c.from) << " -> " << dtype_name(c.to));
    const std::size_t in_bytes = c.from == c.to ? elements * 3 : elements * dtype_bits(c.from) / 8;
    const std::size_t out_bytes = c.from == c.to ? in_bytes : elements * dtype_bits(c.to) / 8;
    std::vector<std::byte> in(in_bytes);
    for (auto& b : in) b = static_cast<std::byte>(byte(rng));
    const auto serial = run(Runner::serial, c.from, c.to, in, out_bytes);
    CHECK(difference(run(Runner::parallel, c.from, c.to, in, out_bytes), serial) == "");
    CHECK(difference(run(Runner::parallel_unaligned, c.from, c.to, in, out_bytes), serial) == "");
    CHECK(difference(run(Runner::serial_unaligned, c.from, c.to, in, out_bytes), serial) == "");
    // Inside a caller's arena (as the backend's executors call it) the result is the same.
    tbb::task_arena arena(2);
    std::vector<std::byte> out(out_bytes);
    arena.execute([&] { convert(c.from, c.to, in, out); });
    CHECK(difference(out, serial) == "");
    if (c.from == c.to) CHECK(difference(serial, in) == "");
  }
}

TEST_CASE("convert – large outputs (streaming stores) give the scalar reference's bits at any alignment",
          "[cpu][convert][exhaustive]") {
  // Every 16-bit pattern, repeated until the output passes the streaming threshold.
  std::vector<std::uint16_t> halves;
  const auto all = all_16bit();
  while (halves.size() * 4 < convert_stream_bytes + 4096) halves.insert(halves.end(), all.begin(), all.end());
  halves.resize(halves.size() - 5);  // a tail after the last full vector
  const auto in = to_bytes(halves);
  INFO("kernels: " << convert_isa_name());
  for (DType t : {DType::BF16, DType::F16}) {
    for (std::size_t out_shift : {0u, 4u, 8u, 12u, 28u, 3u}) {  // 3: never 32-byte aligned
      INFO(dtype_name(t) << ", output at +" << out_shift);
      std::vector<std::byte> out_buf(halves.size() * 4 + 64);
      auto base = reinterpret_cast<std::uintptr_t>(out_buf.data());
      const std::size_t align = (32 - base % 32) % 32;
      std::span<std::byte> dst = std::span<std::byte>(out_buf).subspan(align + out_shift, halves.size() * 4);
      for (bool parallel : {false, true}) {
        std::fill(out_buf.begin(), out_buf.end(), std::byte{0xAB});
        parallel ? convert(t, DType::F32, in, dst) : convert_serial(t, DType::F32, in, dst);
        const auto f32 = from_bytes<std::uint32_t>(dst);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < halves.size(); ++i) {
          const float want = t == DType::BF16 ? bf16_to_f32(halves[i]) : f16_to_f32(halves[i]);
          if (f32[i] != bits_of(want)) ++bad;
        }
        CHECK(bad == 0);
        // Nothing outside the output was written.
        CHECK(std::all_of(out_buf.begin(), out_buf.begin() + static_cast<std::ptrdiff_t>(align + out_shift),
                          [](std::byte b) { return b == std::byte{0xAB}; }));
        CHECK(std::all_of(out_buf.begin() + static_cast<std::ptrdiff_t>(align + out_shift + dst.size()), out_buf.end(),
                          [](std::byte b) { return b == std::byte{0xAB}; }));
      }
    }
  }
}

TEST_CASE("convert – large same-dtype copies (streaming stores) are exact at any alignment",
          "[cpu][convert][parallel]") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<unsigned> byte(0, 255);
  std::vector<std::byte> in(convert_stream_bytes + 4096 + 7);
  for (auto& b : in) b = static_cast<std::byte>(byte(rng));
  for (std::size_t in_shift : {0u, 1u, 32u}) {
    for (std::size_t out_shift : {0u, 5u, 31u}) {
      INFO("input at +" << in_shift << ", output at +" << out_shift);
      const std::span<const std::byte> src = std::span<const std::byte>(in).subspan(in_shift);
      std::vector<std::byte> out_buf(src.size() + 64, std::byte{0xAB});
      const auto base = reinterpret_cast<std::uintptr_t>(out_buf.data());
      const std::size_t start = (32 - base % 32) % 32 + out_shift;
      const std::span<std::byte> dst = std::span<std::byte>(out_buf).subspan(start, src.size());
      convert_serial(DType::U8, DType::U8, src, dst, ConvertStores::streaming);
      CHECK(difference(dst, src) == "");
      CHECK(std::all_of(out_buf.begin(), out_buf.begin() + static_cast<std::ptrdiff_t>(start),
                        [](std::byte b) { return b == std::byte{0xAB}; }));
      CHECK(std::all_of(out_buf.begin() + static_cast<std::ptrdiff_t>(start + dst.size()), out_buf.end(),
                        [](std::byte b) { return b == std::byte{0xAB}; }));
    }
  }
}
