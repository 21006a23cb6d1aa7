#pragma once
/// \file
/// eredu::cpu::HostBuffer: a weight parked in compact host memory (TransferBackend's host
/// representation), outside the tensor storage pool.

#include <cstddef>
#include <memory>
#include <span>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"

namespace eredu::cpu {

/// Exactly a weight's bytes plus its dtype and shape. The bytes are shared with an
/// in-flight transfer, which must keep them alive until it completes.
class HostBuffer {
 public:
  HostBuffer() = default;
  /// An uninitialized buffer of `bytes` bytes for a `dtype` × `shape` weight.
  HostBuffer(DType dtype, Shape shape, std::size_t bytes)
      : dtype_(dtype),
        shape_(std::move(shape)),
        size_(bytes),
        data_(std::make_shared_for_overwrite<std::byte[]>(bytes)) {}

  /// Element type.
  DType dtype() const noexcept { return dtype_; }
  /// Dimensions.
  const Shape& shape() const noexcept { return shape_; }
  /// The bytes.
  std::span<std::byte> bytes() const noexcept { return {data_.get(), size_}; }
  /// Shared ownership of the bytes, for transfers in flight.
  const std::shared_ptr<std::byte[]>& shared_bytes() const noexcept { return data_; }

 private:
  DType dtype_{};
  Shape shape_;
  std::size_t size_ = 0;
  std::shared_ptr<std::byte[]> data_;
};

}  // namespace eredu::cpu
