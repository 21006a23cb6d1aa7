// The shared option table: the dtype names both front ends accept.
#include <catch2/catch.hpp>

#include "eredu/app/option_presets.hpp"

using namespace eredu;

TEST_CASE("parse_cast accepts every spelling of the three cast targets, in any case", "[app][options]") {
  // "keep" selects a choice (engaged) whose cast is none.
  REQUIRE(app::parse_cast("keep"));
  CHECK_FALSE(*app::parse_cast("keep"));
  REQUIRE(app::parse_cast("KEEP"));
  CHECK_FALSE(*app::parse_cast("KEEP"));
  for (const char* name : {"fp16", "F16", "float16", "Half"})
    CHECK(app::parse_cast(name) == std::optional(std::optional(DType::F16)));
  for (const char* name : {"bf16", "BF16", "bfloat16"})
    CHECK(app::parse_cast(name) == std::optional(std::optional(DType::BF16)));
  for (const char* name : {"f32", "FP32", "float32", "float"})
    CHECK(app::parse_cast(name) == std::optional(std::optional(DType::F32)));
  // Names of no cast target, and names longer than any choice, select nothing.
  for (const char* name : {"", "int8", "f64", "float16x", "bfloat16bfloat16", "q4_k"})
    CHECK_FALSE(app::parse_cast(name));
}
