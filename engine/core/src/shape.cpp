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
  std::uint64_t bits = 0;
  if (__builtin_mul_overflow(elements, std::uint64_t{dtype_bits(t)}, &bits)) return std::nullopt;
  if (bits % 8 != 0) return std::nullopt;
  return bits / 8;
}

std::string format_shape(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace eredu
