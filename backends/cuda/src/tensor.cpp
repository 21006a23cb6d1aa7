#include "eredu/cuda/tensor.hpp"

#include <fmt/format.h>
#include <cstdint>
#include <optional>

#include "eredu/core/error.hpp"

namespace eredu::cuda {
namespace {

std::optional<std::uint64_t> byte_size(const Shape& shape, DType dtype) {
  auto elements = checked_element_count(shape);
  auto bytes = elements ? checked_byte_size(*elements, dtype) : std::nullopt;
  if (!bytes || *bytes > SIZE_MAX) return std::nullopt;
  return bytes;
}

}  // namespace

Tensor Tensor::allocate(DeviceMemoryPool& pool, DType dtype, Shape shape, const std::shared_ptr<const Stream>& stream,
                        const std::string& name) {
  const std::optional<std::uint64_t> bytes = byte_size(shape, dtype);
  if (!bytes)
    throw Error(errc::size_overflow, {.tensor = name},
                fmt::format("tensor of {} {} has no representable byte size", dtype_name(dtype), format_shape(shape)));
  auto storage = pool.allocate(static_cast<std::size_t>(*bytes), stream, name);
  return Tensor(dtype, std::move(shape), std::move(storage));
}

std::uint64_t Tensor::elements() const noexcept { return checked_element_count(shape_).value_or(0); }

Tensor Tensor::reshaped(Shape shape) const {
  const std::optional<std::uint64_t> bytes = byte_size(shape, dtype_);
  if (!bytes || *bytes != nbytes())
    throw Error(errc::invalid_argument, {},
                fmt::format("cannot view {} bytes of {} {} as {}", nbytes(), dtype_name(dtype_), format_shape(shape_),
                            format_shape(shape)));
  return Tensor(dtype_, std::move(shape), storage_);
}

}  // namespace eredu::cuda
