#pragma once
/// \file
/// eredu::io::Lease: a read-only view of exactly the requested bytes of one tensor.

#include <cstdint>
#include <span>

#include "eredu/io/formats/tensor_info.hpp"
#include "eredu/io/reading/staging_buffer.hpp"

namespace eredu::io {

/// Move-only view of the bytes a TensorReadRequest asked for (the selected elements,
/// contiguous and row-major), held in the lease pool. Dropping the lease returns its
/// staging memory; hold it only while the bytes are consumed — the pool's budget is
/// shared by every read in flight. The source (and its pool) must outlive the lease.
class Lease {
 public:
  Lease() noexcept = default;
  /// Wraps `buffer`, exposing `size` bytes from `view_offset` (internal: built by readers).
  Lease(StagingBuffer buffer, std::size_t view_offset, std::size_t size, const TensorInfo* tensor, std::uint64_t offset,
        std::uint64_t total) noexcept
      : buffer_(std::move(buffer)),
        view_offset_(view_offset),
        size_(size),
        tensor_(tensor),
        offset_(offset),
        total_(total) {}
  Lease(Lease&&) noexcept = default;
  Lease& operator=(Lease&&) noexcept = default;

  /// The requested bytes (for a chunk, this chunk's part of them).
  std::span<const std::byte> bytes() const noexcept { return {buffer_.data() + view_offset_, size_}; }
  /// The tensor these bytes belong to.
  const TensorInfo& tensor() const noexcept { return *tensor_; }
  /// Offset of bytes() within all the bytes the request selected (non-zero for chunks).
  std::uint64_t offset() const noexcept { return offset_; }
  /// Bytes the whole request selected.
  std::uint64_t total() const noexcept { return total_; }
  /// True when this lease holds the request's last byte.
  bool last() const noexcept { return offset_ + size_ == total_; }
  /// Staging bytes this lease holds (its page-rounded, possibly direct-aligned, window).
  std::size_t staged_bytes() const noexcept { return buffer_.size(); }
  /// True when the lease holds memory.
  explicit operator bool() const noexcept { return static_cast<bool>(buffer_); }
  /// Returns the staging memory now.
  void release() noexcept { buffer_.reset(); }

 private:
  StagingBuffer buffer_;
  std::size_t view_offset_ = 0;
  std::size_t size_ = 0;
  const TensorInfo* tensor_ = nullptr;
  std::uint64_t offset_ = 0;
  std::uint64_t total_ = 0;
};

}  // namespace eredu::io
