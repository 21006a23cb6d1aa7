#include "eredu/core/shape.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace eredu {

std::optional<std::uint64_t> checked_element_count(const Shape& shape) noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

std::optional<std::uint64_t> checked_byte_size(std::uint64_t elements, DType t) noexcept {
  if (!dtype_is_quantized(t)) {
    // Counted in bits, as the safetensors reference counts them: a size whose bit count
    // overflows 64 bits is refused even when its byte count would fit.
    std::uint64_t bits = 0;
    if (__builtin_mul_overflow(elements, std::uint64_t{dtype_bits(t)}, &bits)) return std::nullopt;
    if (bits % 8 != 0) return std::nullopt;
    return bits / 8;
  }
  const DTypeBlock block = dtype_block(t);
  if (elements % block.elements != 0) return std::nullopt;
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements / block.elements, std::uint64_t{block.bytes}, &bytes)) return std::nullopt;
  return bytes;
}

std::string block_shape_error(const Shape& shape, DType t) {
  if (!dtype_is_quantized(t)) return {};
  const DTypeBlock block = dtype_block(t);
  if (shape.empty()) {
    return fmt::format("a {} tensor needs at least one dimension: its values are stored in blocks of {}", dtype_name(t),
                       block.elements);
  }
  if (shape.back() % block.elements != 0) {
    return fmt::format("the last dimension of shape {} is {}, not a multiple of the {} values of a {} block",
                       format_shape(shape), shape.back(), block.elements, dtype_name(t));
  }
  return {};
}

StorageUnits storage_units(const Shape& shape, DType t) {
  const DTypeBlock block = dtype_block(t);
  StorageUnits units{shape, block.bytes};
  if (block.elements > 1 && !units.shape.empty()) units.shape.back() /= block.elements;
  return units;
}

std::string format_shape(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace eredu
