#include "eredu/cpu/tensor.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::cpu {

Tensor Tensor::allocate(StoragePool& pool, DType dtype, Shape shape) {
  auto elements = checked_element_count(shape);
  auto bytes = elements ? checked_byte_size(*elements, dtype) : std::nullopt;
  if (!bytes || *bytes > SIZE_MAX)
    throw Error(errc::size_overflow, {},
                fmt::format("tensor of {} {} has no representable byte size", dtype_name(dtype), format_shape(shape)));
  auto block = std::make_shared<StorageBlock>(pool.allocate(static_cast<std::size_t>(*bytes)));
  return Tensor(dtype, std::move(shape), std::move(block));
}

Tensor::Tensor(DType dtype, Shape shape, std::shared_ptr<StorageBlock> storage) noexcept
    : dtype_(dtype), shape_(std::move(shape)), storage_(std::move(storage)) {}

std::uint64_t Tensor::elements() const noexcept { return checked_element_count(shape_).value_or(0); }

Tensor Tensor::reshaped(Shape shape) const {
  auto elements = checked_element_count(shape);
  auto bytes = elements ? checked_byte_size(*elements, dtype_) : std::nullopt;
  if (!bytes || *bytes != nbytes())
    throw Error(errc::invalid_argument, {},
                fmt::format("cannot view {} bytes of {} {} as {}", nbytes(), dtype_name(dtype_), format_shape(shape_),
                            format_shape(shape)));
  return Tensor(dtype_, std::move(shape), storage_);
}

}  // namespace eredu::cpu
