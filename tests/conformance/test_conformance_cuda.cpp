// The backend conformance suite on the CUDA backend. It builds wherever the CUDA backend does;
// where no device is present every runtime case passes with a WARN "no CUDA device (...):
// skipping" (the concept checks still run: they are compile-time). CUDA is not an
// InPlaceBackend, which the in-place case checks and reports.

#include <asio/io_context.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "conformance/conformance_adapter.hpp"
#include "eredu/cuda/backend.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/cuda/pinned_registration.hpp"

namespace eredu::test {

/// The CUDA backend's conformance adapter (device 0).
struct CudaAdapter : ConformanceDefaults<cuda::Backend> {
  static constexpr const char* name = "cuda";  ///< for WARN messages
  static constexpr bool transfer = true;       ///< claims TransferBackend
  static constexpr bool in_place = false;      ///< no overwrite: not an InPlaceBackend
  static constexpr bool collective = false;    ///< no collectives: not a CollectiveBackend
  static constexpr bool gather_into = false;   ///< nor a GatherIntoBackend
  /// "" with a device; otherwise why none can be used (as tests/cuda/test_cuda_gpu.cpp says it).
  static std::string unavailable() {
    return cuda::device_count() > 0 ? std::string() : "no CUDA device (" + cuda::no_device_reason() + ")";
  }
  /// One stream, a device pool, and the source's staging pool page-locked (unpinned before
  /// the source goes: the Env is destroyed first).
  struct Env {
    Env(asio::io_context&, io::CheckpointSource& source) : memory(0), pin(cuda::pin_staging(source)) {}
    cuda::MaterializationContext& context() { return mc; }
    cuda::Executor& executor() { return stream; }
    cuda::Executor stream{0};
    cuda::DeviceMemoryPool memory;
    cuda::PinnedRegistration pin;
    cuda::MaterializationContext mc{stream, memory, &pin};
  };
  /// The device bytes of a completed tensor (a blocking copy: tests only).
  static std::vector<std::byte> host_bytes(const cuda::Tensor& t) {
    std::vector<std::byte> out(t.nbytes());
    if (!out.empty()) cuda::check(cudaMemcpy(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
  /// The device address.
  static const void* address(const cuda::Tensor& t) { return t.data(); }
};

}  // namespace eredu::test

#define EREDU_CONFORMANCE_ADAPTERS eredu::test::CudaAdapter
#include "conformance/backend_conformance.hpp"
