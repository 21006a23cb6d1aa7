#include "eredu/cuda/device_memory_pool.hpp"

#include <fmt/format.h>
#include <cstdint>

#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/cuda/stream.hpp"

namespace eredu::cuda {

/// The native pool, destroyed when the pool object and every block from it are gone.
struct DeviceMemoryPool::State {
  cudaMemPool_t pool = nullptr;
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
  if (data_) (void)cudaFreeAsync(data_, home_->get());
}

DeviceMemoryPool::DeviceMemoryPool(int device, std::size_t max_bytes)
    : device_(device), state_(std::make_shared<State>()) {
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
  const cudaError_t status = cudaMallocFromPoolAsync(&p, n, state_->pool, stream->get());
  if (status != cudaSuccess) {
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
