#include "eredu/cuda/pinned_registration.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>
#include <functional>
#include <utility>

#include "eredu/cuda/cuda_error.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace eredu::cuda {

PinnedRegistration::PinnedRegistration(std::span<std::byte> memory) {
  if (memory.empty()) return;
  const cudaError_t status = cudaHostRegister(memory.data(), memory.size(), cudaHostRegisterPortable);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    BackendError e = cuda_error(status, "cudaHostRegister");
    throw BackendError(e.kind(), e.context(),
                       fmt::format("page-locking {} bytes of staging memory: {}", memory.size(), e.detail()));
  }
  memory_ = memory;
}

PinnedRegistration::PinnedRegistration(PinnedRegistration&& other) noexcept
    : memory_(std::exchange(other.memory_, {})), keep_(std::exchange(other.keep_, std::nullopt)) {}

PinnedRegistration& PinnedRegistration::operator=(PinnedRegistration&& other) noexcept {
  if (this != &other) {
    reset();
    memory_ = std::exchange(other.memory_, {});
    keep_ = std::exchange(other.keep_, std::nullopt);
  }
  return *this;
}

PinnedRegistration::~PinnedRegistration() { reset(); }

void PinnedRegistration::reset() noexcept {
  // Swallowed: a destructor cannot report, and unregistering only fails on a broken runtime.
  if (!memory_.empty()) (void)cudaHostUnregister(memory_.data());
  memory_ = {};
  keep_.reset();  // after the unregistration: the pool may release its pages from now on
}

bool PinnedRegistration::contains(std::span<const std::byte> bytes) const noexcept {
  if (memory_.empty()) return false;
  // std::less gives a total order on pointers into unrelated objects.
  std::less<const std::byte*> lt;
  const std::byte* begin = memory_.data();
  const std::byte* end = memory_.data() + memory_.size();
  return !lt(bytes.data(), begin) && !lt(end, bytes.data() + bytes.size()) &&
         !lt(bytes.data() + bytes.size(), bytes.data());
}

PinnedRegistration pin_staging(io::LeasePool& pool) {
  // Kept resident first, so no release can come between locking the pages and holding them.
  io::LeasePool::KeepResident keep = pool.keep_resident();
  PinnedRegistration pinned(pool.memory());
  pinned.keep_.emplace(std::move(keep));
  return pinned;
}

PinnedRegistration pin_staging(io::CheckpointSource& source) { return pin_staging(source.pool()); }

}  // namespace eredu::cuda
