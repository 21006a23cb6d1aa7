#pragma once
/// \file
/// Stream-ordered device memory: eredu::cuda::DeviceMemoryPool (a cudaMemPool_t) and
/// eredu::cuda::DeviceAllocation (one block of it).
///
/// Blocks come from cudaMallocFromPoolAsync on a stream and go back with cudaFreeAsync on
/// the same stream (their *home* stream) when the last handle is dropped: the free is ordered
/// after everything already queued on that stream, so a temporary may be dropped right after
/// the kernel that reads it has been queued. Work queued on *other* streams is not covered:
/// whoever reads a block there must keep a handle until that work has completed (every
/// operation of the backend retains its blocks until its Completion fires). The pool keeps
/// freed memory for reuse (release threshold: unlimited) so that repeated loads and
/// hot-swaps do not return memory to the driver and map it again.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

namespace eredu::cuda {

class Stream;
class DeviceMemoryPool;

/// One block of device memory from a DeviceMemoryPool. Shared by every handle that uses it
/// (a tensor and its aliases); freed stream-ordered on its home stream by the destructor.
class DeviceAllocation {
  struct Key {
    explicit Key() = default;
  };

 public:
  /// Use DeviceMemoryPool::allocate(); the key keeps construction inside the pool.
  DeviceAllocation(Key, std::byte* data, std::size_t size, int device, std::shared_ptr<const Stream> home,
                   std::shared_ptr<const void> pool) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  /// cudaFreeAsync on the home stream; errors are swallowed (a destructor cannot report them).
  ~DeviceAllocation();

  /// Device address of the first byte.
  std::byte* data() const noexcept { return data_; }
  /// Bytes allocated.
  std::size_t size() const noexcept { return size_; }
  /// The device the memory lives on.
  int device() const noexcept { return device_; }

 private:
  friend class DeviceMemoryPool;
  std::byte* data_;
  std::size_t size_;
  int device_;
  std::shared_ptr<const Stream> home_;  // kept alive: the free is queued on it
  std::shared_ptr<const void> pool_;    // kept alive: the block belongs to it
};

/// A device memory pool (see file comment). Thread-safe: allocations may come from any
/// thread. Blocks hold the pool's state alive, so the pool object may go before them.
class DeviceMemoryPool {
 public:
  /// A new pool on `device` that keeps freed memory for reuse and holds at most `max_bytes`
  /// (0: as much as the device has; a limit makes out-of-memory testable and keeps room for
  /// other users of the device). The limit counts the bytes handed out and not yet freed, a
  /// free counting once it is queued; the pool enforces it itself, because drivers take
  /// cudaMemPoolProps::maxSize only as a bound on what they map. Throws BackendError naming cudaMemPoolCreate (for
  /// example when no device is present).
  explicit DeviceMemoryPool(int device, std::size_t max_bytes = 0);
  DeviceMemoryPool(const DeviceMemoryPool&) = delete;
  DeviceMemoryPool& operator=(const DeviceMemoryPool&) = delete;
  ~DeviceMemoryPool();

  /// `bytes` bytes (at least 1) queued on `stream`, which becomes the block's home stream.
  /// Throws BackendError(out_of_memory) naming `tensor` when the pool's limit or the device
  /// cannot hold it (the latter naming cudaMallocFromPoolAsync), BackendError(backend_failure)
  /// for other errors.
  std::shared_ptr<DeviceAllocation> allocate(std::size_t bytes, const std::shared_ptr<const Stream>& stream,
                                             const std::string& tensor = {});

  /// Returns unused cached memory to the driver, keeping at most `keep_bytes`.
  void trim(std::size_t keep_bytes = 0);
  /// Bytes the pool holds from the driver (used and cached).
  std::size_t reserved_bytes() const;
  /// Bytes handed out and not yet freed.
  std::size_t used_bytes() const;
  /// The device.
  int device() const noexcept { return device_; }
  /// The native handle.
  cudaMemPool_t get() const noexcept;

 private:
  friend class DeviceAllocation;  // counts its bytes back into the state's limit
  struct State;
  int device_;
  std::shared_ptr<State> state_;
};

}  // namespace eredu::cuda
