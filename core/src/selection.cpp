#include "eredu/core/selection.hpp"

#include <fmt/format.h>

namespace eredu {

Selection Selection::rows(const Shape& shape, std::uint64_t start, std::uint64_t stop) {
  Selection s;
  for (std::size_t d = 0; d < shape.size(); ++d) s.ranges.push_back({0, shape[d]});
  if (!s.ranges.empty()) s.ranges.front() = {start, stop};
  return s;
}

Selection Selection::columns(const Shape& shape, std::uint64_t start, std::uint64_t stop) {
  Selection s;
  for (std::size_t d = 0; d < shape.size(); ++d) s.ranges.push_back({0, shape[d]});
  if (!s.ranges.empty()) s.ranges.back() = {start, stop};
  return s;
}

Shape Selection::selected_shape(const Shape& shape) const {
  if (ranges.empty()) return shape;
  Shape out;
  out.reserve(ranges.size());
  for (const auto& r : ranges) out.push_back(r.size());
  return out;
}

std::string Selection::check(const Shape& shape) const {
  if (ranges.empty()) return {};
  if (ranges.size() != shape.size()) {
    return fmt::format("selection has {} ranges but the tensor has rank {}", ranges.size(), shape.size());
  }
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const auto& r = ranges[d];
    if (r.start > r.stop || r.stop > shape[d]) {
      return fmt::format("range {}:{} of dimension {} does not fit its size {}", r.start, r.stop, d, shape[d]);
    }
  }
  return {};
}

std::string Selection::to_string() const {
  if (ranges.empty()) return "[all]";
  std::string out = "[";
  for (std::size_t d = 0; d < ranges.size(); ++d) {
    if (d) out += ", ";
    out += fmt::format("{}:{}", ranges[d].start, ranges[d].stop);
  }
  return out + "]";
}

std::optional<Selection> Selection::parse(std::string_view text) {
  if (text == "[all]") return Selection::all();
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  text = text.substr(1, text.size() - 2);
  std::size_t at = 0;
  auto skip_spaces = [&] {
    while (at < text.size() && text[at] == ' ') ++at;
  };
  // A decimal number without sign or leading '+'; fails on overflow.
  auto number = [&](std::uint64_t& out) {
    skip_spaces();
    const std::size_t begin = at;
    out = 0;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9') {
      const auto digit = static_cast<std::uint64_t>(text[at] - '0');
      if (out > (UINT64_MAX - digit) / 10) return false;
      out = out * 10 + digit;
      ++at;
    }
    skip_spaces();
    return at > begin;
  };
  Selection out;
  for (;;) {
    Range r;
    if (!number(r.start) || at >= text.size() || text[at++] != ':' || !number(r.stop) || r.start > r.stop)
      return std::nullopt;
    out.ranges.push_back(r);
    if (at == text.size()) return out;
    if (text[at++] != ',') return std::nullopt;
  }
}

std::string selection_block_error(const Shape& shape, DType dtype, const Selection& selection) {
  if (!dtype_is_quantized(dtype) || selection.is_all() || shape.empty()) return {};
  const std::uint32_t per_block = dtype_block(dtype).elements;
  const Range last = selection.ranges.back();
  if (last.start % per_block != 0 || last.stop % per_block != 0) {
    return fmt::format(
        "range {}:{} of the last dimension cuts {} blocks of {} values: it must start and stop on a "
        "multiple of {}",
        last.start, last.stop, dtype_name(dtype), per_block, per_block);
  }
  return {};
}

namespace {

// The runs of `selection` over a row-major grid of `shape` units of `elem` bytes each.
std::vector<ByteRun> unit_runs(const Shape& shape, std::uint64_t elem, const Selection& selection) {
  std::vector<ByteRun> runs;
  const std::size_t rank = shape.size();
  for (const auto& r : selection.ranges) {
    if (r.size() == 0) return runs;  // nothing selected
  }
  // Find the innermost dimension that is not selected whole: everything inside it is
  // one contiguous run per index of the outer dimensions.
  std::size_t k = rank;  // k == rank: every dimension whole
  for (std::size_t d = rank; d-- > 0;) {
    if (selection.ranges[d].start != 0 || selection.ranges[d].stop != shape[d]) {
      k = d;
      break;
    }
  }
  // stride[d] = bytes between consecutive indices of dimension d.
  std::vector<std::uint64_t> stride(rank + 1, elem);
  for (std::size_t d = rank; d-- > 0;) stride[d] = stride[d + 1] * shape[d];
  if (k == rank) {
    if (stride[0]) runs.push_back({0, 0, stride[0]});
    return runs;
  }
  const std::uint64_t run_len = selection.ranges[k].size() * stride[k + 1];
  const std::uint64_t run_base = selection.ranges[k].start * stride[k + 1];
  // Odometer over the outer dimensions [0, k); index i of dimension d advances the
  // source by stride[d + 1] bytes.
  std::vector<std::uint64_t> idx(k);
  for (std::size_t d = 0; d < k; ++d) idx[d] = selection.ranges[d].start;
  std::uint64_t dest = 0;
  while (true) {
    std::uint64_t src = run_base;
    for (std::size_t d = 0; d < k; ++d) src += idx[d] * stride[d + 1];
    if (!runs.empty() && runs.back().source_offset + runs.back().length == src) {
      runs.back().length += run_len;
    } else {
      runs.push_back({src, dest, run_len});
    }
    dest += run_len;
    std::size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < selection.ranges[d].stop) break;
      idx[d] = selection.ranges[d].start;
      if (d == 0) return runs;
    }
    if (k == 0) return runs;
  }
}

}  // namespace

std::vector<ByteRun> selection_runs(const Shape& shape, DType dtype, const Selection& selection) {
  if (selection.is_all()) {
    std::vector<ByteRun> runs;
    auto n = checked_element_count(shape);
    auto bytes = n ? checked_byte_size(*n, dtype) : std::nullopt;
    if (bytes && *bytes) runs.push_back({0, 0, *bytes});
    return runs;
  }
  if (dtype_is_quantized(dtype)) {
    // Blocks are the units: the last dimension and its range counted in blocks.
    const std::uint32_t per_block = dtype_block(dtype).elements;
    const StorageUnits units = storage_units(shape, dtype);
    Selection in_blocks = selection;
    in_blocks.ranges.back() = {selection.ranges.back().start / per_block, selection.ranges.back().stop / per_block};
    return unit_runs(units.shape, units.unit_bytes, in_blocks);
  }
  return unit_runs(shape, dtype_bits(dtype) / 8, selection);
}

}  // namespace eredu
