#include "eredu/core/dtype.hpp"

#include <catch2/catch.hpp>

#include "eredu/core/shape.hpp"

using namespace eredu;

TEST_CASE("dtype – every name round-trips and has the safetensors bit width", "[core][dtype]") {
  for (std::size_t i = 0; i < dtype_count; ++i) {
    auto t = static_cast<DType>(i);
    auto back = dtype_from_name(dtype_name(t));
    REQUIRE(back.has_value());
    CHECK(*back == t);
  }
  CHECK(dtype_bits(DType::F4) == 4);
  CHECK(dtype_bits(DType::F6_E3M2) == 6);
  CHECK(dtype_bits(DType::BF16) == 16);
  CHECK(dtype_bits(DType::C64) == 64);
  CHECK(dtype_name(DType::F8_E4M3FNUZ) == "F8_E4M3FNUZ");
}

TEST_CASE("dtype – names are case-sensitive", "[core][dtype]") {
  CHECK_FALSE(dtype_from_name("f32").has_value());
  CHECK_FALSE(dtype_from_name("F128").has_value());
  CHECK_FALSE(dtype_from_name("").has_value());
}

TEST_CASE("shape – element counts and byte sizes are overflow-checked", "[core][shape]") {
  CHECK(checked_element_count({}) == 1u);
  CHECK(checked_element_count({2, 0, 5}) == 0u);
  CHECK(checked_element_count({1ull << 32, 1ull << 32}) == std::nullopt);
  // Folded left to right: overflow is found before the trailing zero.
  CHECK(checked_element_count({2, ~0ull - 1, 0}) == std::nullopt);
  CHECK(checked_byte_size(3, DType::F32) == 12u);
  CHECK(checked_byte_size(4, DType::F4) == 2u);
  CHECK(checked_byte_size(3, DType::F4) == std::nullopt);
  CHECK(checked_byte_size(4, DType::F6_E2M3) == 3u);
  CHECK(checked_byte_size(2, DType::F6_E2M3) == std::nullopt);
  CHECK(checked_byte_size(9223372036854775807ull, DType::I32) == std::nullopt);
  CHECK(format_shape({2, 3}) == "[2, 3]");
  CHECK(format_shape({}) == "[]");
}
