#pragma once
/// \file
/// eredu::cuda::Tensor: a dtype, a shape and contiguous device memory.
///
/// Storage is shared between handles: a tied weight (an alias) and a reshaped view are other
/// Tensors over the same device bytes, never copies. The memory goes back to its
/// DeviceMemoryPool, stream-ordered on its home stream, when the last handle is dropped.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/cuda/device_memory_pool.hpp"

namespace eredu::cuda {

/// Row-major tensor in device memory (see file comment). Cheap to copy: a copy is another
/// handle to the same bytes. Its bytes are only valid to read once the Completion of the
/// work that wrote them has fired (or on a stream ordered after it).
class Tensor {
 public:
  /// An empty tensor; `bool(t)` is false.
  Tensor() noexcept = default;
  /// Allocates `dtype` × `shape` from `pool`, queued on `stream` (its home stream).
  /// Throws BackendError(out_of_memory) naming `name`, Error(size_overflow).
  static Tensor allocate(DeviceMemoryPool& pool, DType dtype, Shape shape, const std::shared_ptr<const Stream>& stream,
                         const std::string& name = {});
  /// Wraps existing device storage holding exactly the tensor's bytes.
  Tensor(DType dtype, Shape shape, std::shared_ptr<DeviceAllocation> storage) noexcept
      : dtype_(dtype), shape_(std::move(shape)), storage_(std::move(storage)) {}

  /// Element type.
  DType dtype() const noexcept { return dtype_; }
  /// Dimensions.
  const Shape& shape() const noexcept { return shape_; }
  /// Number of elements.
  std::uint64_t elements() const noexcept;
  /// Byte size of the data.
  std::size_t nbytes() const noexcept { return storage_ ? storage_->size() : 0; }
  /// Device address of the data (nullptr when empty).
  std::byte* data() const noexcept { return storage_ ? storage_->data() : nullptr; }
  /// The device holding the data (-1 when empty).
  int device() const noexcept { return storage_ ? storage_->device() : -1; }
  /// The same bytes seen with another shape of equal byte size (a view, no copy). Throws
  /// Error(invalid_argument) when the sizes differ.
  Tensor reshaped(Shape shape) const;
  /// True when both handles share storage.
  bool shares_storage_with(const Tensor& other) const noexcept { return storage_ && storage_ == other.storage_; }
  /// The storage (shared with aliases; in-flight work holds it too).
  const std::shared_ptr<DeviceAllocation>& storage() const noexcept { return storage_; }
  /// True when the tensor holds storage.
  explicit operator bool() const noexcept { return storage_ != nullptr; }

 private:
  DType dtype_{};
  Shape shape_;
  std::shared_ptr<DeviceAllocation> storage_;
};

}  // namespace eredu::cuda
