// Tests of the CPU backend's layout kernels (slice, concat, permute) against naive
// index-arithmetic references, at sizes small (inline) and large (parallel), and of their
// argument checks.
#include "eredu/cpu/layout.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"

using namespace eredu;
using namespace eredu::cpu;

namespace {

// "" when equal, otherwise where the first difference is: Catch would print whole
// megabyte buffers for a failed ==.
std::string layout_difference(std::span<const std::byte> got, std::span<const std::byte> want) {
  if (got.size() != want.size())
    return "got " + std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  const auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
  if (g == got.end()) return "";
  const auto at = static_cast<std::size_t>(g - got.begin());
  const auto differing = std::inner_product(got.begin(), got.end(), want.begin(), std::size_t{0}, std::plus<>{},
                                            [](std::byte a, std::byte b) { return a != b ? 1u : 0u; });
  return std::to_string(differing) + " of " + std::to_string(got.size()) + " bytes differ, the first at byte " +
         std::to_string(at) + ": got " + std::to_string(std::to_integer<int>(*g)) + ", want " +
         std::to_string(std::to_integer<int>(*w));
}

std::size_t count(const Shape& s) { return std::accumulate(s.begin(), s.end(), std::size_t{1}, std::multiplies<>{}); }

// Bytes that identify their position: a reordering of elements or of bytes within one shows.
std::vector<std::byte> pattern(std::size_t bytes, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(bytes);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

// Multi-index of linear element `i` in row-major `shape`, into `idx` (reused: no allocation
// per element keeps the references fast enough under sanitizers).
void unravel(std::size_t i, const Shape& shape, std::vector<std::size_t>& idx) {
  idx.resize(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = i % shape[k];
    i /= shape[k];
  }
}

std::size_t ravel(const std::vector<std::size_t>& idx, const Shape& shape) {
  std::size_t i = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) i = i * shape[k] + idx[k];
  return i;
}

void copy_element(std::vector<std::byte>& out, std::size_t o, const std::byte* in, std::size_t i, std::size_t elem) {
  std::copy_n(in + i * elem, elem, out.begin() + static_cast<std::ptrdiff_t>(o * elem));
}

std::vector<std::byte> reference_slice(const std::vector<std::byte>& in, const Shape& shape, std::size_t elem,
                                       std::size_t dim, Range r) {
  Shape out_shape = shape;
  out_shape[dim] = r.size();
  std::vector<std::byte> out(count(out_shape) * elem);
  std::vector<std::size_t> idx;
  for (std::size_t o = 0; o < count(out_shape); ++o) {
    unravel(o, out_shape, idx);
    idx[dim] += r.start;
    copy_element(out, o, in.data(), ravel(idx, shape), elem);
  }
  return out;
}

std::vector<std::byte> reference_concat(const std::vector<std::vector<std::byte>>& ins,
                                        const std::vector<Shape>& shapes, std::size_t dim, std::size_t elem) {
  Shape out_shape = shapes[0];
  out_shape[dim] = 0;
  for (const auto& s : shapes) out_shape[dim] += s[dim];
  std::vector<std::byte> out(count(out_shape) * elem);
  std::vector<std::size_t> idx;
  for (std::size_t o = 0; o < count(out_shape); ++o) {
    unravel(o, out_shape, idx);
    std::size_t which = 0;
    while (idx[dim] >= shapes[which][dim]) idx[dim] -= shapes[which++][dim];
    copy_element(out, o, ins[which].data(), ravel(idx, shapes[which]), elem);
  }
  return out;
}

std::vector<std::byte> reference_permute(const std::vector<std::byte>& in, const Shape& shape, std::size_t elem,
                                         const std::vector<std::size_t>& order) {
  Shape out_shape(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) out_shape[i] = shape[order[i]];
  std::vector<std::byte> out(in.size());
  std::vector<std::size_t> out_idx, in_idx(shape.size());
  for (std::size_t o = 0; o < count(out_shape); ++o) {
    unravel(o, out_shape, out_idx);
    for (std::size_t i = 0; i < shape.size(); ++i) in_idx[order[i]] = out_idx[i];
    copy_element(out, o, in.data(), ravel(in_idx, shape), elem);
  }
  return out;
}

std::vector<std::byte> run_permute(const std::vector<std::byte>& in, const Shape& shape, std::size_t elem,
                                   const std::vector<std::size_t>& order) {
  std::vector<std::byte> out(in.size(), std::byte{0xEE});
  permute(in, shape, elem, order, out);
  return out;
}

template <class F>
void require_invalid(F&& f, const std::string& mentions) {
  try {
    f();
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains(mentions));
  }
}

}  // namespace

TEST_CASE("layout – slicing each dim of a 3-d tensor matches the reference", "[cpu][layout][slice]") {
  const std::size_t elem = GENERATE(1, 2, 3, 4, 8);
  const Shape shape = GENERATE(Shape{5, 7, 9}, Shape{32, 150, 40});  // the second runs in parallel
  const auto in = pattern(count(shape) * elem, 1);
  for (std::size_t dim = 0; dim < 3; ++dim) {
    const std::uint64_t n = shape[dim];
    for (Range r : {Range{1, n - 2}, Range{0, n}, Range{n / 2, n / 2}, Range{n - 1, n}}) {
      INFO("elem " << elem << ", shape " << format_shape(shape) << ", dim " << dim << ", range " << r.start << ".."
                   << r.stop);
      const auto want = reference_slice(in, shape, elem, dim, r);
      std::vector<std::byte> out(want.size(), std::byte{0xEE});
      copy_slice(in, shape, elem, dim, r, out);
      CHECK(layout_difference(out, want) == "");
    }
  }
}

TEST_CASE("layout – a slice reads and writes unaligned buffers", "[cpu][layout][slice]") {
  const Shape shape{33, 17};
  std::vector<std::byte> in_buf = pattern(count(shape) * 4 + 1, 2), out_buf(10 * 17 * 4 + 3);
  const auto in = std::span<const std::byte>(in_buf).subspan(1);
  const auto out = std::span<std::byte>(out_buf).subspan(3);
  copy_slice(in, shape, 4, 0, Range{5, 15}, out);
  const auto want = reference_slice({in.begin(), in.end()}, shape, 4, 0, Range{5, 15});
  CHECK(layout_difference(out, want) == "");
}

TEST_CASE("layout – slice rejects inconsistent arguments without writing", "[cpu][layout][slice][errors]") {
  const Shape shape{4, 6};
  const auto in = pattern(24 * 2, 3);
  std::vector<std::byte> out(2 * 6 * 2, std::byte{0xEE});
  require_invalid([&] { copy_slice(in, shape, 2, 2, Range{0, 2}, out); }, "dim 2");
  require_invalid([&] { copy_slice(in, shape, 2, 0, Range{3, 5}, out); }, "[3, 5)");
  require_invalid([&] { copy_slice(in, shape, 2, 0, Range{3, 1}, out); }, "[3, 1)");
  require_invalid([&] { copy_slice(std::span(in).first(40), shape, 2, 0, Range{0, 2}, out); }, "40");
  require_invalid([&] { copy_slice(in, shape, 2, 0, Range{0, 3}, out); }, "36");
  require_invalid([&] { copy_slice(in, shape, 0, 0, Range{0, 2}, out); }, "element size");
  require_invalid([&] { copy_slice(in, Shape{}, 2, 0, Range{0, 1}, out); }, "rank 0");
  CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0xEE}; }));
}

TEST_CASE("layout – concat along dim 0, a middle dim and the last dim matches the reference", "[cpu][layout][concat]") {
  struct Case {
    std::vector<Shape> shapes;
    std::size_t dim;
  };
  const std::size_t elem = GENERATE(1, 2, 4, 8);
  for (const Case& c :
       {Case{{{3, 5}, {4, 5}, {1, 5}}, 0},                                               // fused QKV
        Case{{{6, 7}, {6, 7}}, 0},                                                       // gate + up
        Case{{{4, 3}, {4, 6}}, 1},                                                       // along the last dim
        Case{{{4, 3}, {4, 1}, {4, 5}}, 1}, Case{{{2, 3, 4}, {2, 5, 4}, {2, 0, 4}}, 1},   // an empty input
        Case{{{2, 3, 4}, {2, 3, 7}}, 2}, Case{{{2048, 64}, {1024, 64}, {1024, 64}}, 0},  // parallel, contiguous pieces
        Case{{{4096, 40}, {4096, 24}}, 1},                                               // parallel, short rows
        Case{{{3, 70000}, {3, 1000}}, 1}}) {                                             // parallel, rows split
    std::vector<std::vector<std::byte>> ins;
    std::vector<ConcatInput> inputs;
    for (std::size_t i = 0; i < c.shapes.size(); ++i)
      ins.push_back(pattern(count(c.shapes[i]) * elem, 10 + unsigned(i)));
    for (std::size_t i = 0; i < c.shapes.size(); ++i) inputs.push_back({ins[i], c.shapes[i]});
    const auto want = reference_concat(ins, c.shapes, c.dim, elem);
    INFO("elem " << elem << ", first shape " << format_shape(c.shapes[0]) << ", dim " << c.dim);
    std::vector<std::byte> out(want.size(), std::byte{0xEE});
    concat(inputs, c.dim, elem, out);
    CHECK(layout_difference(out, want) == "");
  }
}

TEST_CASE("layout – concat rejects inconsistent arguments", "[cpu][layout][concat][errors]") {
  const auto a = pattern(4 * 3 * 2, 4), b = pattern(4 * 6 * 2, 5);
  std::vector<std::byte> out(4 * 9 * 2);
  auto run = [&](std::vector<ConcatInput> inputs, std::size_t dim, std::span<std::byte> dst) {
    concat(inputs, dim, 2, dst);
  };
  require_invalid([&] { run({}, 0, out); }, "no inputs");
  require_invalid([&] { run({{a, {4, 3}}, {b, {4, 6}}}, 2, out); }, "dim 2");
  require_invalid([&] { run({{a, {4, 3}}, {b, {24}}}, 1, out); }, "rank 1");
  require_invalid([&] { run({{a, {4, 3}}, {b, {8, 3}}}, 1, out); }, "[8, 3]");
  require_invalid([&] { run({{a, {4, 3}}, {b, {4, 5}}}, 1, out); }, "48");
  require_invalid([&] { run({{a, {4, 3}}, {b, {4, 6}}}, 1, std::span(out).first(70)); }, "70");
  CHECK_NOTHROW(run({{a, {4, 3}}, {b, {4, 6}}}, 1, out));
}

TEST_CASE("layout – transposing non-square matrices that are not tile multiples matches the reference",
          "[cpu][layout][permute]") {
  const std::size_t elem = GENERATE(1, 2, 3, 4, 8, 16);
  const Shape shape = GENERATE(Shape{67, 131}, Shape{131, 67}, Shape{1031, 517}, Shape{1, 9}, Shape{2, 100000});
  const auto in = pattern(count(shape) * elem, 6);
  INFO("elem " << elem << ", shape " << format_shape(shape));
  CHECK(layout_difference(run_permute(in, shape, elem, {1, 0}), reference_permute(in, shape, elem, {1, 0})) == "");
}

TEST_CASE("layout – batched transposes and 3-d permutations match the reference", "[cpu][layout][permute]") {
  const std::size_t elem = GENERATE(1, 2, 4, 8);
  const Shape shape = GENERATE(Shape{3, 67, 131}, Shape{5, 6, 7}, Shape{40, 130, 70});
  const auto in = pattern(count(shape) * elem, 7);
  for (std::vector<std::size_t> order :
       {std::vector<std::size_t>{0, 2, 1}, {2, 0, 1}, {1, 2, 0}, {1, 0, 2}, {2, 1, 0}, {0, 1, 2}}) {
    INFO("elem " << elem << ", shape " << format_shape(shape) << ", order " << order[0] << order[1] << order[2]);
    CHECK(layout_difference(run_permute(in, shape, elem, order), reference_permute(in, shape, elem, order)) == "");
  }
}

TEST_CASE("layout – every permutation of 4-d and 5-d tensors, with size-1 dims, matches the reference",
          "[cpu][layout][permute]") {
  const std::size_t elem = GENERATE(1, 2, 3, 4, 8);
  const Shape shape = GENERATE(Shape{3, 4, 5, 6}, Shape{3, 1, 5, 2}, Shape{1, 7, 1, 9}, Shape{2, 3, 1, 4, 5},
                               Shape{6, 20, 24, 30});  // the last one runs in parallel
  const auto in = pattern(count(shape) * elem, 8);
  std::vector<std::size_t> order(shape.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::size_t bad = 0, tried = 0;
  do {
    ++tried;
    if (run_permute(in, shape, elem, order) != reference_permute(in, shape, elem, order)) ++bad;
  } while (std::next_permutation(order.begin(), order.end()));
  INFO("elem " << elem << ", shape " << format_shape(shape));
  CHECK(tried >= 24);
  CHECK(bad == 0);
}

TEST_CASE("layout – permute handles rank 0, empty tensors and unaligned buffers", "[cpu][layout][permute]") {
  const auto scalar = pattern(4, 9);
  CHECK(layout_difference(run_permute(scalar, Shape{}, 4, {}), scalar) == "");
  std::vector<std::byte> none;
  CHECK_NOTHROW(permute(none, Shape{3, 0, 2}, 4, std::vector<std::size_t>{2, 0, 1}, none));
  const Shape shape{37, 53};
  std::vector<std::byte> in_buf = pattern(count(shape) * 8 + 1, 10), out_buf(count(shape) * 8 + 5);
  const auto in = std::span<const std::byte>(in_buf).subspan(1);
  const auto out = std::span<std::byte>(out_buf).subspan(5);
  permute(in, shape, 8, std::vector<std::size_t>{1, 0}, out);
  const auto want = reference_permute({in.begin(), in.end()}, shape, 8, {1, 0});
  CHECK(layout_difference(out, want) == "");
}

TEST_CASE("layout – permute rejects inconsistent arguments without writing", "[cpu][layout][permute][errors]") {
  const Shape shape{4, 6};
  const auto in = pattern(24 * 4, 11);
  std::vector<std::byte> out(24 * 4, std::byte{0xEE});
  using Order = std::vector<std::size_t>;
  require_invalid([&] { permute(in, shape, 4, Order{1, 0, 2}, out); }, "3 entries");
  require_invalid([&] { permute(in, shape, 4, Order{1, 1}, out); }, "not a permutation");
  require_invalid([&] { permute(in, shape, 4, Order{0, 2}, out); }, "not a permutation");
  require_invalid([&] { permute(std::span(in).first(90), shape, 4, Order{1, 0}, out); }, "90");
  require_invalid([&] { permute(in, shape, 4, Order{1, 0}, std::span(out).first(92)); }, "92");
  require_invalid([&] { permute(in, shape, 0, Order{1, 0}, out); }, "element size");
  CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0xEE}; }));
}
