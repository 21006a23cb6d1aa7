#include "eredu/cpu/layout.hpp"

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"

namespace eredu::cpu {
namespace {

[[noreturn]] void fail(const std::string& detail) { throw Error(errc::invalid_argument, {}, detail); }

std::size_t checked_mul(std::size_t a, std::size_t b, const char* what) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(fmt::format("{}: {} x {} overflows the address space", what, a, b));
  return r;
}

// Product of dims[first, last) times `scale`, overflow-checked: a zero dimension elsewhere
// does not make a partial product safe to compute unchecked.
std::size_t product(const Shape& dims, std::size_t first, std::size_t last, std::size_t scale, const char* what) {
  std::size_t r = scale;
  for (std::size_t i = first; i < last; ++i) r = checked_mul(r, static_cast<std::size_t>(dims[i]), what);
  return r;
}

void require_elem(std::size_t elem, const char* what) {
  if (elem == 0) fail(fmt::format("{}: the element size is 0 bytes", what));
}

void require_size(std::size_t actual, std::size_t expected, const char* what, const char* which, const Shape& shape,
                  std::size_t elem) {
  if (actual != expected)
    fail(fmt::format("{}: the {} has {} bytes but shape {} of {}-byte elements needs {} bytes", what, which, actual,
                     format_shape(shape), elem, expected));
}

// Copies `rows` rows of `row_bytes` bytes between strided buffers, in parallel pieces of
// about layout_block_bytes: whole rows grouped when rows are short, a row split when long.
void copy_rows(std::byte* dst, std::size_t dst_stride, const std::byte* src, std::size_t src_stride, std::size_t rows,
               std::size_t row_bytes) {
  if (rows == 0 || row_bytes == 0) return;
  if (rows * row_bytes <= layout_block_bytes) {
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, row_bytes);
    return;
  }
  if (row_bytes >= layout_block_bytes) {
    const std::size_t pieces_per_row = (row_bytes + layout_block_bytes - 1) / layout_block_bytes;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows * pieces_per_row),
                      [&](const tbb::blocked_range<std::size_t>& range) {
                        for (std::size_t p = range.begin(); p != range.end(); ++p) {
                          const std::size_t r = p / pieces_per_row;
                          const std::size_t first = (p % pieces_per_row) * layout_block_bytes;
                          const std::size_t n = std::min(layout_block_bytes, row_bytes - first);
                          std::memcpy(dst + r * dst_stride + first, src + r * src_stride + first, n);
                        }
                      });
    return;
  }
  const std::size_t rows_per_task = layout_block_bytes / row_bytes;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows, rows_per_task),
                    [&](const tbb::blocked_range<std::size_t>& range) {
                      for (std::size_t r = range.begin(); r != range.end(); ++r)
                        std::memcpy(dst + r * dst_stride, src + r * src_stride, row_bytes);
                    });
}

// Moves one element of E bytes (E == 0: `elem` bytes, known only at run time).
template <std::size_t E>
inline void move_element(std::byte* dst, const std::byte* src, [[maybe_unused]] std::size_t elem) noexcept {
  if constexpr (E == 0) {
    std::memcpy(dst, src, elem);
  } else {
    std::memcpy(dst, src, E);
  }
}

// A batch of row-major [rows, cols] matrices transposed into [cols, rows] ones.
struct Transpose {
  std::size_t batch = 1;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t elem = 0;
};

template <std::size_t E>
void transpose_tiled(const std::byte* in, std::byte* out, const Transpose& t) {
  // A tile of the input and its image in the output stay in L1 while it is copied, so
  // the strided side of the copy hits cache instead of a new line per element.
  const std::size_t tile = t.elem <= 2 ? 64 : (t.elem <= 8 ? 32 : 16);
  const std::size_t tiles_r = (t.rows + tile - 1) / tile;
  const std::size_t tiles_c = (t.cols + tile - 1) / tile;
  const std::size_t matrix_bytes = t.rows * t.cols * t.elem;
  const std::size_t elem = t.elem;
  auto run_tiles = [&](std::size_t first, std::size_t last) {
    for (std::size_t k = first; k < last; ++k) {
      const std::size_t b = k / (tiles_r * tiles_c);
      const std::size_t tr = (k / tiles_c) % tiles_r;
      const std::size_t tc = k % tiles_c;
      const std::byte* src = in + b * matrix_bytes;
      std::byte* dst = out + b * matrix_bytes;
      const std::size_t r0 = tr * tile, r1 = std::min(t.rows, r0 + tile);
      const std::size_t c0 = tc * tile, c1 = std::min(t.cols, c0 + tile);
      // Column-outer: each output row segment is written contiguously.
      for (std::size_t c = c0; c < c1; ++c)
        for (std::size_t r = r0; r < r1; ++r)
          move_element<E>(dst + (c * t.rows + r) * elem, src + (r * t.cols + c) * elem, elem);
    }
  };
  const std::size_t tiles = t.batch * tiles_r * tiles_c;
  if (t.batch * matrix_bytes <= layout_block_bytes) {
    run_tiles(0, tiles);
    return;
  }
  const std::size_t grain = std::max<std::size_t>(1, layout_block_bytes / (tile * tile * elem));
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, tiles, grain),
                    [&](const tbb::blocked_range<std::size_t>& r) { run_tiles(r.begin(), r.end()); });
}

void transpose(const std::byte* in, std::byte* out, const Transpose& t) {
  switch (t.elem) {
    case 1:
      return transpose_tiled<1>(in, out, t);
    case 2:
      return transpose_tiled<2>(in, out, t);
    case 4:
      return transpose_tiled<4>(in, out, t);
    case 8:
      return transpose_tiled<8>(in, out, t);
    case 16:
      return transpose_tiled<16>(in, out, t);
    default:
      return transpose_tiled<0>(in, out, t);
  }
}

// General permutation: every output row (the last output dimension) is a strided gather
// from the input. `dims` are the input dimensions, `perm` the output order.
template <std::size_t E>
void permute_strided(const std::byte* in, std::byte* out, const std::vector<std::size_t>& dims,
                     const std::vector<std::size_t>& perm, std::size_t elem) {
  const std::size_t rank = dims.size();
  std::vector<std::size_t> in_stride(rank, 1);
  for (std::size_t i = rank - 1; i > 0; --i) in_stride[i - 1] = in_stride[i] * dims[i];
  std::vector<std::size_t> out_dims(rank), stride(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    out_dims[i] = dims[perm[i]];
    stride[i] = in_stride[perm[i]];
  }
  const std::size_t row_len = out_dims[rank - 1];
  const std::size_t row_stride = stride[rank - 1];
  const std::size_t rows = std::accumulate(out_dims.begin(), out_dims.end() - 1, std::size_t{1}, std::multiplies<>{});
  auto run_rows = [&](std::size_t first, std::size_t last) {
    // Decompose the first row index once, then step the output index like an odometer.
    std::vector<std::size_t> idx(rank - 1);
    std::size_t base = 0;
    for (std::size_t k = rank - 1, rest = first; k-- > 0;) {
      idx[k] = rest % out_dims[k];
      rest /= out_dims[k];
      base += idx[k] * stride[k];
    }
    for (std::size_t row = first; row < last; ++row) {
      std::byte* dst = out + row * row_len * elem;
      for (std::size_t j = 0; j < row_len; ++j)
        move_element<E>(dst + j * elem, in + (base + j * row_stride) * elem, elem);
      for (std::size_t k = rank - 1; k-- > 0;) {
        base += stride[k];
        if (++idx[k] < out_dims[k]) break;
        base -= idx[k] * stride[k];
        idx[k] = 0;
      }
    }
  };
  if (rows * row_len * elem <= layout_block_bytes) {
    run_rows(0, rows);
    return;
  }
  const std::size_t grain = std::max<std::size_t>(1, layout_block_bytes / (row_len * elem));
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows, grain),
                    [&](const tbb::blocked_range<std::size_t>& r) { run_rows(r.begin(), r.end()); });
}

void permute_general(const std::byte* in, std::byte* out, const std::vector<std::size_t>& dims,
                     const std::vector<std::size_t>& perm, std::size_t elem) {
  switch (elem) {
    case 1:
      return permute_strided<1>(in, out, dims, perm, elem);
    case 2:
      return permute_strided<2>(in, out, dims, perm, elem);
    case 4:
      return permute_strided<4>(in, out, dims, perm, elem);
    case 8:
      return permute_strided<8>(in, out, dims, perm, elem);
    default:
      return permute_strided<0>(in, out, dims, perm, elem);
  }
}

}  // namespace

void copy_slice(std::span<const std::byte> in, const Shape& in_shape, std::size_t elem, std::size_t dim, Range range,
                std::span<std::byte> out) {
  constexpr const char* what = "slice";
  require_elem(elem, what);
  if (dim >= in_shape.size())
    fail(fmt::format("slice: dim {} is out of range for shape {} of rank {}", dim, format_shape(in_shape),
                     in_shape.size()));
  if (range.start > range.stop || range.stop > in_shape[dim])
    fail(fmt::format("slice: range [{}, {}) does not fit dim {} of size {}", range.start, range.stop, dim,
                     in_shape[dim]));
  require_size(in.size(), product(in_shape, 0, in_shape.size(), elem, what), what, "input", in_shape, elem);
  Shape out_shape = in_shape;
  out_shape[dim] = range.size();
  require_size(out.size(), product(out_shape, 0, out_shape.size(), elem, what), what, "output", out_shape, elem);
  const std::size_t outer = product(in_shape, 0, dim, 1, what);
  const std::size_t inner = product(in_shape, dim + 1, in_shape.size(), elem, what);
  const std::size_t out_row = checked_mul(static_cast<std::size_t>(range.size()), inner, what);
  const std::size_t in_row = checked_mul(static_cast<std::size_t>(in_shape[dim]), inner, what);
  if (out.empty()) return;
  copy_rows(out.data(), out_row, in.data() + range.start * inner, in_row, outer, out_row);
}

void concat(std::span<const ConcatInput> inputs, std::size_t dim, std::size_t elem, std::span<std::byte> out) {
  constexpr const char* what = "concat";
  require_elem(elem, what);
  if (inputs.empty()) fail("concat: no inputs");
  const Shape& first = inputs[0].shape;
  const std::size_t rank = first.size();
  if (dim >= rank) fail(fmt::format("concat: dim {} is out of range for rank {}", dim, rank));
  std::size_t total = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Shape& s = inputs[i].shape;
    if (s.size() != rank) fail(fmt::format("concat: input {} has rank {} but input 0 has rank {}", i, s.size(), rank));
    for (std::size_t d = 0; d < rank; ++d)
      if (d != dim && s[d] != first[d])
        fail(
            fmt::format("concat: input {} has shape {} but input 0 has shape {}; they differ in dim {}, not only in "
                        "the concat dim {}",
                        i, format_shape(s), format_shape(first), d, dim));
    require_size(inputs[i].bytes.size(), product(s, 0, rank, elem, what), what, "input", s, elem);
    if (__builtin_add_overflow(total, static_cast<std::size_t>(s[dim]), &total))
      fail("concat: the concatenated dimension overflows");
  }
  Shape out_shape = first;
  out_shape[dim] = total;
  require_size(out.size(), product(out_shape, 0, rank, elem, what), what, "output", out_shape, elem);
  if (out.empty()) return;
  const std::size_t outer = product(first, 0, dim, 1, what);
  const std::size_t inner = product(first, dim + 1, rank, elem, what);
  const std::size_t out_row = total * inner;
  std::size_t offset = 0;
  for (const ConcatInput& input : inputs) {
    const std::size_t row = static_cast<std::size_t>(input.shape[dim]) * inner;
    copy_rows(out.data() + offset, out_row, input.bytes.data(), row, outer, row);
    offset += row;
  }
}

void permute(std::span<const std::byte> in, const Shape& in_shape, std::size_t elem, std::span<const std::size_t> order,
             std::span<std::byte> out) {
  constexpr const char* what = "permute";
  require_elem(elem, what);
  const std::size_t rank = in_shape.size();
  if (order.size() != rank)
    fail(fmt::format("permute: the order has {} entries but shape {} has rank {}", order.size(), format_shape(in_shape),
                     rank));
  std::vector<bool> seen(rank, false);
  for (std::size_t i = 0; i < rank; ++i) {
    if (order[i] >= rank || seen[order[i]])
      fail(fmt::format("permute: order [{}] is not a permutation of 0..{}", fmt::join(order, ", "), rank - 1));
    seen[order[i]] = true;
  }
  const std::size_t bytes = product(in_shape, 0, rank, elem, what);
  require_size(in.size(), bytes, what, "input", in_shape, elem);
  Shape out_shape(rank);
  for (std::size_t i = 0; i < rank; ++i) out_shape[i] = in_shape[order[i]];
  require_size(out.size(), bytes, what, "output", out_shape, elem);
  if (bytes == 0) return;

  // Reduce the permutation to its essential form: size-1 dimensions do not move bytes,
  // input dimensions that stay adjacent and in order act as one, and a trailing
  // dimension that stays last widens the element. What remains is the identity, one
  // (batched) transpose, or a general permutation.
  std::vector<std::size_t> kept(rank, SIZE_MAX);  // input dim -> index among non-1 dims
  std::size_t n = 0;
  for (std::size_t d = 0; d < rank; ++d)
    if (in_shape[d] != 1) kept[d] = n++;
  std::vector<std::size_t> p;  // output order over the kept dims
  for (std::size_t i = 0; i < rank; ++i)
    if (kept[order[i]] != SIZE_MAX) p.push_back(kept[order[i]]);
  std::vector<std::size_t> sizes;
  for (std::size_t d = 0; d < rank; ++d)
    if (in_shape[d] != 1) sizes.push_back(static_cast<std::size_t>(in_shape[d]));
  // Groups of consecutive input dims, in output order: (first input dim, count).
  std::vector<std::pair<std::size_t, std::size_t>> groups;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (!groups.empty() && p[i] == groups.back().first + groups.back().second)
      ++groups.back().second;
    else
      groups.emplace_back(p[i], 1);
  }
  std::vector<std::size_t> by_input(groups.size());  // group indices in input order
  std::iota(by_input.begin(), by_input.end(), std::size_t{0});
  std::sort(by_input.begin(), by_input.end(),
            [&](std::size_t a, std::size_t b) { return groups[a].first < groups[b].first; });
  std::vector<std::size_t> dims(groups.size()), perm(groups.size());
  for (std::size_t k = 0; k < by_input.size(); ++k) {
    const auto [start, count] = groups[by_input[k]];
    dims[k] = std::accumulate(sizes.begin() + static_cast<std::ptrdiff_t>(start),
                              sizes.begin() + static_cast<std::ptrdiff_t>(start + count), std::size_t{1},
                              std::multiplies<>{});
    perm[by_input[k]] = k;
  }
  std::size_t unit = elem;
  if (!perm.empty() && perm.back() == perm.size() - 1) {
    unit *= dims.back();
    dims.pop_back();
    perm.pop_back();
  }

  if (perm.empty()) {
    copy_rows(out.data(), 0, in.data(), 0, 1, bytes);
  } else if (perm.size() == 2) {  // (1, 0): the only rank-2 order left after merging
    transpose(in.data(), out.data(), Transpose{.batch = 1, .rows = dims[0], .cols = dims[1], .elem = unit});
  } else if (perm.size() == 3 && perm[0] == 0 && perm[1] == 2 && perm[2] == 1) {
    transpose(in.data(), out.data(), Transpose{.batch = dims[0], .rows = dims[1], .cols = dims[2], .elem = unit});
  } else {
    permute_general(in.data(), out.data(), dims, perm, unit);
  }
}

}  // namespace eredu::cpu
