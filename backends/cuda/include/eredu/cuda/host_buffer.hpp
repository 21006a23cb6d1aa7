#pragma once
/// \file
/// eredu::cuda::HostBuffer: a weight parked in page-locked host memory (the
/// TransferBackend's host representation), so demote and promote are DMA copies.

#include <cstddef>
#include <memory>
#include <span>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"

namespace eredu::cuda {

/// Page-locked host memory (cudaMallocHost), freed with cudaFreeHost by the last handle.
class PinnedBlock {
 public:
  /// Allocates `bytes` (at least 1) pinned bytes. Throws BackendError(out_of_memory) naming
  /// cudaMallocHost, or BackendError(backend_failure) (no device, no driver).
  explicit PinnedBlock(std::size_t bytes);
  PinnedBlock(const PinnedBlock&) = delete;
  PinnedBlock& operator=(const PinnedBlock&) = delete;
  /// cudaFreeHost; errors are swallowed.
  ~PinnedBlock();
  /// The bytes.
  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Exactly a weight's bytes, page-locked, plus its dtype and shape. Cheap to copy: copies
/// share the bytes, which an in-flight transfer keeps alive until it completes.
class HostBuffer {
 public:
  /// An empty buffer.
  HostBuffer() = default;
  /// An uninitialized pinned buffer for a `dtype` × `shape` weight of `bytes` bytes.
  HostBuffer(DType dtype, Shape shape, std::size_t bytes)
      : dtype_(dtype), shape_(std::move(shape)), size_(bytes), block_(std::make_shared<PinnedBlock>(bytes)) {}

  /// Element type.
  DType dtype() const noexcept { return dtype_; }
  /// Dimensions.
  const Shape& shape() const noexcept { return shape_; }
  /// The weight's bytes (read them only after the demote's completion).
  std::span<std::byte> bytes() const noexcept { return block_ ? block_->bytes().first(size_) : std::span<std::byte>{}; }
  /// Shared ownership of the memory, for transfers in flight.
  const std::shared_ptr<PinnedBlock>& block() const noexcept { return block_; }

 private:
  DType dtype_{};
  Shape shape_;
  std::size_t size_ = 0;
  std::shared_ptr<PinnedBlock> block_;
};

}  // namespace eredu::cuda
