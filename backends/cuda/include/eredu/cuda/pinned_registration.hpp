#pragma once
/// \file
/// eredu::cuda::PinnedRegistration: page-locks existing host memory for CUDA
/// (cudaHostRegister), so copies from it are DMA'd to the device directly.
///
/// The lease pool's memory is one mapping (io::LeasePool::memory()); registering it once
/// makes every lease a DMA source without another host copy: `pin_staging(pool)`, for the
/// pool of any source that stages through one (`pin_staging(source)` for a CheckpointSource).
/// The memory must stay mapped while registered: create the registration after the pool's
/// owner and destroy it before (declare it after the source). It also keeps the
/// pool's pages resident (LeasePool::KeepResident): an idle pool returning pages that CUDA
/// has locked would leave the device copying from pages the pool no longer uses.

#include <cstddef>
#include <optional>
#include <span>

#include "eredu/io/reading/lease_pool.hpp"

namespace eredu::io {
class CheckpointSource;
}

namespace eredu::cuda {

/// A page-locked host range (RAII: cudaHostUnregister on destruction). Move-only.
class PinnedRegistration {
 public:
  /// Nothing registered.
  PinnedRegistration() noexcept = default;
  /// Registers `memory` (cudaHostRegisterPortable: usable from every device). Throws
  /// BackendError naming cudaHostRegister; an empty span registers nothing.
  explicit PinnedRegistration(std::span<std::byte> memory);
  PinnedRegistration(PinnedRegistration&& other) noexcept;
  PinnedRegistration& operator=(PinnedRegistration&& other) noexcept;
  PinnedRegistration(const PinnedRegistration&) = delete;
  PinnedRegistration& operator=(const PinnedRegistration&) = delete;
  /// Unregisters; errors are swallowed (a destructor cannot report them).
  ~PinnedRegistration();

  /// The registered range (empty when none).
  std::span<std::byte> memory() const noexcept { return memory_; }
  /// True when `bytes` lies entirely inside the registered range.
  bool contains(std::span<const std::byte> bytes) const noexcept;

 private:
  friend PinnedRegistration pin_staging(io::LeasePool& pool);
  void reset() noexcept;
  std::span<std::byte> memory_;
  std::optional<io::LeasePool::KeepResident> keep_;  // the pool's pages stay while locked
};

/// Registers the staging memory of `pool` (and keeps its pages resident). The pool must
/// outlive the result.
PinnedRegistration pin_staging(io::LeasePool& pool);
/// Registers the staging memory of `source`'s lease pool. The source must outlive the result.
PinnedRegistration pin_staging(io::CheckpointSource& source);

}  // namespace eredu::cuda
