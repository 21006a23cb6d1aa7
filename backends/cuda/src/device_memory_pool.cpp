#include "eredu/cuda/device_memory_pool.hpp"

#include <fmt/format.h>
#include <atomic>
#include <cstdint>

#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/cuda/stream.hpp"

namespace eredu::cuda {

/// The native pool, destroyed when the pool object and every block from it are gone.
struct DeviceMemoryPool::State {
  cudaMemPool_t pool = nullptr;
  std::size_t limit = 0;                            // 0: none but the device's
  mutable std::atomic<std::size_t> outstanding{0};  // bytes handed out and not yet freed, as counted
                                                    // against `limit`
  ~State() {
    // Swallowed: at process exit the runtime may already be gone.
    if (pool) (void)cudaMemPoolDestroy(pool);
  }
};

DeviceAllocation::DeviceAllocation(Key, std::byte* data, std::size_t size, int device,
                                   std::shared_ptr<const Stream> home, std::shared_ptr<const void> pool) noexcept
    : data_(data), size_(size), device_(device), home_(std::move(home)), pool_(std::move(pool)) {}

DeviceAllocation::~DeviceAllocation() {
  // Ordered after everything already queued on the home stream. Swallowed: a destructor
  // cannot report, and the only failures are a broken context or a runtime shut down.
  if (!data_) return;
  (void)cudaFreeAsync(data_, home_->get());
  // Counted back when the free is queued: later allocations on the home stream reuse the
  // block in stream order.
  static_cast<const DeviceMemoryPool::State*>(pool_.get())->outstanding.fetch_sub(size_ ? size_ : 1);
}

DeviceMemoryPool::DeviceMemoryPool(int device, std::size_t max_bytes)
    : device_(device), state_(std::make_shared<State>()) {
  state_->limit = max_bytes;
  cudaMemPoolProps props{};
  props.maxSize = max_bytes;
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  check(cudaMemPoolCreate(&state_->pool, &props), "cudaMemPoolCreate");
  // Keep freed memory cached: a reload or a hot-swap reuses it without new driver mappings.
  std::uint64_t threshold = UINT64_MAX;
  check(cudaMemPoolSetAttribute(state_->pool, cudaMemPoolAttrReleaseThreshold, &threshold),
        "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
}

DeviceMemoryPool::~DeviceMemoryPool() = default;

cudaMemPool_t DeviceMemoryPool::get() const noexcept { return state_->pool; }

std::shared_ptr<DeviceAllocation> DeviceMemoryPool::allocate(std::size_t bytes,
                                                             const std::shared_ptr<const Stream>& stream,
                                                             const std::string& tensor) {
  void* p = nullptr;
  const std::size_t n = bytes ? bytes : 1;
  // The driver takes maxSize as a hint: an H200 (driver 580) let 32 MiB into a 16 MiB pool.
  // So the limit is kept here, before the driver is asked.
  std::size_t before = state_->outstanding.load(std::memory_order_relaxed);
  do {
    if (state_->limit != 0 && (n > state_->limit || before > state_->limit - n))
      throw BackendError(errc::out_of_memory, {.tensor = tensor},
                         fmt::format("device memory pool limit: {} bytes asked for on device {}, {} of {} in use", n,
                                     device_, before, state_->limit));
  } while (!state_->outstanding.compare_exchange_weak(before, before + n, std::memory_order_relaxed));
  const cudaError_t status = cudaMallocFromPoolAsync(&p, n, state_->pool, stream->get());
  if (status != cudaSuccess) {
    state_->outstanding.fetch_sub(n, std::memory_order_relaxed);
    (void)cudaGetLastError();
    BackendError e = cuda_error(status, "cudaMallocFromPoolAsync", tensor);
    throw BackendError(e.kind(), e.context(), fmt::format("{} bytes on device {}: {}", n, device_, e.detail()));
  }
  try {
    // The block holds the pool's state, not the pool object: the pool may be dropped first.
    return std::make_shared<DeviceAllocation>(DeviceAllocation::Key(), static_cast<std::byte*>(p), bytes, device_,
                                              stream, state_);
  } catch (...) {
    (void)cudaFreeAsync(p, stream->get());
    state_->outstanding.fetch_sub(n, std::memory_order_relaxed);
    throw;
  }
}

void DeviceMemoryPool::trim(std::size_t keep_bytes) {
  check(cudaMemPoolTrimTo(state_->pool, keep_bytes), "cudaMemPoolTrimTo");
}

std::size_t DeviceMemoryPool::reserved_bytes() const {
  std::uint64_t v = 0;
  check(cudaMemPoolGetAttribute(state_->pool, cudaMemPoolAttrReservedMemCurrent, &v),
        "cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemCurrent)");
  return v;
}

std::size_t DeviceMemoryPool::used_bytes() const {
  std::uint64_t v = 0;
  check(cudaMemPoolGetAttribute(state_->pool, cudaMemPoolAttrUsedMemCurrent, &v),
        "cudaMemPoolGetAttribute(cudaMemPoolAttrUsedMemCurrent)");
  return v;
}

}  // namespace eredu::cuda
