#pragma once
/// \file
/// eredu::cpu::Tensor: a dtype, a shape and contiguous storage, 64-byte aligned unless the
/// file placed the bytes otherwise (a cold tensor read with its page window, mapped weights:
/// aligned for the elements, at the file's offset within a page).
///
/// Storage is shared between handles: a tied weight (an alias) and a reshaped view are
/// other Tensors over the same bytes, never copies. The storage goes back to its
/// StoragePool when the last handle is dropped.

#include <cstdint>
#include <memory>
#include <span>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/cpu/storage_pool.hpp"

namespace eredu::cpu {

/// Row-major tensor over shared, pooled storage (see file comment). Cheap to copy: a copy is
/// another handle to the same bytes.
class Tensor {
 public:
  /// An empty tensor (no storage); `bool(t)` is false.
  Tensor() noexcept = default;
  /// Allocates storage for `dtype` × `shape` from `pool` (fresh blocks are not populated:
  /// see StoragePool::populate). Throws BackendError(out_of_memory), Error(size_overflow).
  static Tensor allocate(StoragePool& pool, DType dtype, Shape shape);
  /// Wraps an existing block holding exactly the tensor's bytes.
  Tensor(DType dtype, Shape shape, std::shared_ptr<StorageBlock> storage) noexcept;

  /// Element type.
  DType dtype() const noexcept { return dtype_; }
  /// Dimensions.
  const Shape& shape() const noexcept { return shape_; }
  /// Number of elements.
  std::uint64_t elements() const noexcept;
  /// Byte size of the data.
  std::size_t nbytes() const noexcept { return storage_ ? storage_->size() : 0; }
  /// The data, read-only.
  std::span<const std::byte> bytes() const noexcept {
    return storage_ ? std::span<const std::byte>(storage_->bytes()) : std::span<const std::byte>{};
  }
  /// The data, writable: only while the tensor is being produced (materialization, tests).
  std::span<std::byte> mutable_bytes() const noexcept { return storage_ ? storage_->bytes() : std::span<std::byte>{}; }
  /// Typed read-only view; T's size must match the dtype's.
  template <class T>
  std::span<const T> as() const noexcept {
    return {reinterpret_cast<const T*>(bytes().data()), bytes().size() / sizeof(T)};
  }
  /// The same bytes seen with another shape of equal byte size (a view, no copy).
  Tensor reshaped(Shape shape) const;
  /// True when both handles share storage.
  bool shares_storage_with(const Tensor& other) const noexcept { return storage_ && storage_ == other.storage_; }
  /// The storage block (for population and recycling).
  const std::shared_ptr<StorageBlock>& storage() const noexcept { return storage_; }
  /// True when the tensor holds storage.
  explicit operator bool() const noexcept { return storage_ != nullptr; }

 private:
  DType dtype_{};
  Shape shape_;
  std::shared_ptr<StorageBlock> storage_;
};

}  // namespace eredu::cpu
