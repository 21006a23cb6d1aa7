#include "eredu/core/selection.hpp"

#include <catch2/catch.hpp>

using namespace eredu;

TEST_CASE("selection – whole tensor is one run", "[core][selection]") {
  auto runs = selection_runs({4, 8}, DType::F32, Selection::all());
  REQUIRE(runs.size() == 1);
  CHECK(runs[0] == ByteRun{0, 0, 128});
  CHECK(selection_runs({0, 8}, DType::F32, Selection::all()).empty());
}

TEST_CASE("selection – a row range is one contiguous run", "[core][selection]") {
  Shape shape{10, 6};
  auto runs = selection_runs(shape, DType::BF16, Selection::rows(shape, 2, 5));
  REQUIRE(runs.size() == 1);
  CHECK(runs[0] == ByteRun{2 * 12, 0, 3 * 12});
}

TEST_CASE("selection – a column range is one run per row", "[core][selection]") {
  Shape shape{3, 8};
  auto runs = selection_runs(shape, DType::F32, Selection::columns(shape, 2, 6));
  REQUIRE(runs.size() == 3);
  for (std::uint64_t r = 0; r < 3; ++r) CHECK(runs[r] == ByteRun{r * 32 + 8, r * 16, 16});
}

TEST_CASE("selection – rank-3 selections enumerate runs in row-major order", "[core][selection]") {
  Shape shape{2, 3, 4};
  Selection s{{{0, 2}, {1, 3}, {0, 4}}};  // middle dim partial, last whole
  auto runs = selection_runs(shape, DType::U8, s);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0] == ByteRun{4, 0, 8});
  CHECK(runs[1] == ByteRun{16, 8, 8});
  Selection t{{{1, 2}, {0, 3}, {1, 2}}};
  auto runs2 = selection_runs(shape, DType::U8, t);
  REQUIRE(runs2.size() == 3);
  CHECK(runs2[0] == ByteRun{13, 0, 1});
  CHECK(runs2[2] == ByteRun{21, 2, 1});
}

TEST_CASE("selection – check rejects wrong rank and out-of-range bounds", "[core][selection]") {
  Shape shape{4, 4};
  CHECK(Selection::all().check(shape).empty());
  CHECK_FALSE(Selection{{{0, 4}}}.check(shape).empty());
  CHECK_FALSE(Selection{{{0, 5}, {0, 4}}}.check(shape).empty());
  CHECK_FALSE(Selection{{{3, 2}, {0, 4}}}.check(shape).empty());
  CHECK(Selection::rows(shape, 1, 3).selected_shape(shape) == Shape{2, 4});
  CHECK(Selection::rows(shape, 1, 3).to_string() == "[1:3, 0:4]");
}

TEST_CASE("selection – an empty range selects nothing", "[core][selection]") {
  Shape shape{4, 4};
  CHECK(selection_runs(shape, DType::F32, Selection::rows(shape, 2, 2)).empty());
}

TEST_CASE("selection – parse reads what to_string writes and rejects anything else", "[core][selection]") {
  const Selection s{{{0, 4}, {2, 8}, {7, 7}}};
  CHECK(Selection::parse(s.to_string()) == s);
  CHECK(Selection::parse("[0:4,2:8, 7 : 7 ]") == s);
  CHECK(Selection::parse("[all]") == Selection::all());
  CHECK(Selection::parse("[18446744073709551615:18446744073709551615]") == Selection{{{UINT64_MAX, UINT64_MAX}}});
  for (const char* bad : {"", "[]", "[0:4", "0:4]", "[4:0]", "[0:4,]", "[0-4]", "[-1:4]", "[0:4;2:8]", "[a:b]",
                          "[18446744073709551616:0]", "[0:4 2:8]", "[:4]"}) {
    CAPTURE(bad);
    CHECK_FALSE(Selection::parse(bad).has_value());
  }
}
