#pragma once
/// \file
/// Tensor shapes and overflow-checked size arithmetic.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eredu/core/dtype.hpp"

namespace eredu {

/// Row-major tensor dimensions; an empty shape is a rank-0 scalar of one element.
using Shape = std::vector<std::uint64_t>;

/// Product of the dimensions, folded left to right; nullopt if it overflows u64.
std::optional<std::uint64_t> checked_element_count(const Shape& shape) noexcept;

/// Bytes that `elements` values of `t` occupy; nullopt on overflow (of the bit count, for
/// element types, as safetensors counts) or when they are not a whole number of the dtype's
/// blocks (odd F4 counts, F6 counts not a multiple of 4, a Q4_K count not a multiple of 256).
std::optional<std::uint64_t> checked_byte_size(std::uint64_t elements, DType t) noexcept;

/// Empty when a tensor of `shape` can store quantized dtype `t`: rank at least 1 and a last
/// dimension that is a whole number of blocks (always empty for other dtypes); else why not.
std::string block_shape_error(const Shape& shape, DType t);

/// A tensor seen as a row-major grid of its storage units: for a quantized dtype the shape
/// with its last dimension counted in blocks, and the block's bytes; for a whole-byte dtype
/// the shape itself and the element's bytes. Layout kernels move units, so they move a
/// quantized tensor's blocks whole.
struct StorageUnits {
  Shape shape;                   ///< the shape in units
  std::uint64_t unit_bytes = 0;  ///< bytes per unit
};

/// The storage units of a tensor of `shape` and `t` (see StorageUnits). The shape must pass
/// block_shape_error and `t` must not be a sub-byte float.
StorageUnits storage_units(const Shape& shape, DType t);

/// "[2, 3, 4]": a shape as it appears in messages and tables.
std::string format_shape(const Shape& shape);

}  // namespace eredu
