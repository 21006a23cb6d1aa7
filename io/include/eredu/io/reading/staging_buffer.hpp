#pragma once
/// \file
/// eredu::io::StagingBuffer: one page-aligned block of the lease pool's memory.

#include <cstddef>
#include <span>
#include <utility>

namespace eredu::io {

class LeasePool;

/// Move-only handle to a block of staging memory; destroying it returns the block to its
/// LeasePool and wakes the pool's waiters in order. The pool must outlive the buffer.
class StagingBuffer {
 public:
  StagingBuffer() noexcept = default;
  StagingBuffer(StagingBuffer&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), data_(o.data_), size_(o.size_) {}
  StagingBuffer& operator=(StagingBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
      data_ = o.data_;
      size_ = o.size_;
    }
    return *this;
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() { reset(); }

  /// First byte (page-aligned).
  std::byte* data() const noexcept { return data_; }
  /// Usable bytes (the requested size rounded up to whole pages).
  std::size_t size() const noexcept { return size_; }
  /// The whole block.
  std::span<std::byte> span() const noexcept { return {data_, size_}; }
  /// True when the handle holds a block.
  explicit operator bool() const noexcept { return pool_ != nullptr; }
  /// Returns the block to the pool now.
  void reset() noexcept;

 private:
  friend class LeasePool;
  StagingBuffer(LeasePool* pool, std::byte* data, std::size_t size) noexcept : pool_(pool), data_(data), size_(size) {}
  LeasePool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace eredu::io
