#pragma once
/// \file
/// Selections: the per-dimension [start, stop) ranges of a tensor-parallel shard.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/core/shape.hpp"

namespace eredu {

/// A half-open index range [start, stop) along one dimension.
struct Range {
  std::uint64_t start = 0;  ///< first index
  std::uint64_t stop = 0;   ///< one past the last index
  /// Number of indices in the range.
  std::uint64_t size() const noexcept { return stop - start; }
  friend bool operator==(const Range&, const Range&) = default;
};

/// Which part of a tensor to read: empty means the whole tensor, otherwise exactly one
/// range per dimension. The selected elements are delivered contiguous, row-major.
struct Selection {
  std::vector<Range> ranges{};  ///< one per dimension, or none for the whole tensor

  /// The whole tensor.
  static Selection all() { return {}; }
  /// Rows [start, stop) of the first dimension, every other dimension whole.
  static Selection rows(const Shape& shape, std::uint64_t start, std::uint64_t stop);
  /// Indices [start, stop) of the last dimension (a column shard), every other whole.
  static Selection columns(const Shape& shape, std::uint64_t start, std::uint64_t stop);

  /// True when the selection covers the whole tensor.
  bool is_all() const noexcept { return ranges.empty(); }
  /// Shape of the selected sub-tensor for a tensor of `shape` (ranges assumed valid).
  Shape selected_shape(const Shape& shape) const;
  /// Empty string if the selection fits `shape`, otherwise why not.
  std::string check(const Shape& shape) const;
  /// "[0:4, 2:8]" for messages and as a key (the whole tensor is "[all]").
  std::string to_string() const;
  /// The selection to_string() wrote ("[0:4, 2:8]", spaces optional, "[all]"), or nullopt
  /// when `text` is not one (a range whose start exceeds its stop included).
  static std::optional<Selection> parse(std::string_view text);
  friend bool operator==(const Selection&, const Selection&) = default;
};

/// A contiguous run of selected bytes: `length` bytes at `source_offset` within the
/// tensor's bytes land at `dest_offset` of the delivered buffer.
struct ByteRun {
  std::uint64_t source_offset = 0;  ///< offset within the tensor's stored bytes
  std::uint64_t dest_offset = 0;    ///< offset within the selected, contiguous output
  std::uint64_t length = 0;         ///< bytes
  friend bool operator==(const ByteRun&, const ByteRun&) = default;
};

/// Empty when `selection` (which fits `shape`) keeps every block of a quantized `dtype` whole,
/// else why not: the range of the last dimension must start and stop on block boundaries
/// (rows of a quantized matrix are whole blocks; a column range cuts them unless it is
/// block-aligned). Always empty for other dtypes.
std::string selection_block_error(const Shape& shape, DType dtype, const Selection& selection);

/// The byte runs that make up `selection` of a tensor of `shape` and `dtype`, in
/// ascending order, with adjacent runs merged (a row range is one run). The dtype must
/// have a whole number of bytes per element, or be quantized with a selection that passes
/// selection_block_error, unless the selection is the whole tensor.
std::vector<ByteRun> selection_runs(const Shape& shape, DType dtype, const Selection& selection);

}  // namespace eredu
