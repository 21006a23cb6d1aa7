#include "eredu/core/dtype.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

#include "eredu/core/shape.hpp"

using namespace eredu;

TEST_CASE("dtype – every name round-trips and has the safetensors bit width", "[core][dtype]") {
  for (std::size_t i = 0; i < dtype_count; ++i) {
    auto t = static_cast<DType>(i);
    INFO(dtype_name(t));
    // Safetensors names parse as safetensors dtypes; quantized names only as any dtype.
    CHECK(dtype_from_name(dtype_name(t)).has_value() == (i < safetensors_dtype_count));
    CHECK(dtype_from_any_name(dtype_name(t)) == t);
    CHECK(dtype_is_quantized(t) == (i >= safetensors_dtype_count));
  }
  CHECK(dtype_from_any_name("q4_k") == DType::Q4_K);
  CHECK(dtype_from_any_name("bf16") == DType::BF16);
  CHECK_FALSE(dtype_from_name("Q4_K").has_value());
  CHECK(dtype_bits(DType::F4) == 4);
  CHECK(dtype_bits(DType::F6_E3M2) == 6);
  CHECK(dtype_bits(DType::BF16) == 16);
  CHECK(dtype_bits(DType::C64) == 64);
  CHECK(dtype_name(DType::F8_E4M3FNUZ) == "F8_E4M3FNUZ");
}

TEST_CASE("dtype – quantized types are blocks of ggml's sizes, with exact byte counts", "[core][dtype]") {
  CHECK(dtype_block(DType::Q4_K) == DTypeBlock{256, 144});
  CHECK(dtype_block(DType::Q8_0) == DTypeBlock{32, 34});
  CHECK(dtype_block(DType::MXFP4) == DTypeBlock{32, 17});
  CHECK(dtype_block(DType::TQ1_0) == DTypeBlock{256, 54});
  CHECK(dtype_block(DType::BF16) == DTypeBlock{1, 2});
  CHECK(dtype_block(DType::F4) == DTypeBlock{2, 1});
  CHECK(dtype_block(DType::F6_E2M3) == DTypeBlock{4, 3});
  CHECK(dtype_bits(DType::Q4_K) == 0);
  std::size_t largest = 0;
  for (std::size_t i = 0; i < dtype_count; ++i) largest = std::max<std::size_t>(largest, dtype_block(DType(i)).bytes);
  CHECK(largest == max_dtype_block_bytes);
  CHECK(checked_byte_size(512, DType::Q4_K) == 288u);
  CHECK(checked_byte_size(100, DType::Q4_K) == std::nullopt);
  CHECK(checked_byte_size(~0ull / 256 * 256, DType::Q8_K) == std::nullopt);  // overflows
  CHECK(block_shape_error({4, 512}, DType::Q4_K).empty());
  CHECK_THAT(block_shape_error({512, 4}, DType::Q4_K), Catch::Contains("not a multiple of the 256"));
  CHECK_FALSE(block_shape_error({}, DType::Q8_0).empty());
  CHECK(block_shape_error({3}, DType::F32).empty());
  const StorageUnits u = storage_units({4, 512}, DType::Q4_K);
  CHECK(u.shape == Shape{4, 2});
  CHECK(u.unit_bytes == 144);
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
