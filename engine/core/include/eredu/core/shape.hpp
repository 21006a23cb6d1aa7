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

/// Bytes that `elements` values of `t` occupy; nullopt on overflow or when the bit count
/// is not a whole number of bytes (odd F4 counts, F6 counts not a multiple of 4).
std::optional<std::uint64_t> checked_byte_size(std::uint64_t elements, DType t) noexcept;

/// "[2, 3, 4]": a shape as it appears in messages and tables.
std::string format_shape(const Shape& shape);

}  // namespace eredu
