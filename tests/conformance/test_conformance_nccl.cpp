// The backend conformance suite on the NCCL backend (nccl::Backend: the CUDA backend with
// collectives over NCCL), its collective cases over a group of one rank: this process's own MPI
// group, split from the world, made an NCCL communicator on device 0. It builds wherever
// eredu_nccl does; where no device is present every runtime case passes with a WARN "no CUDA
// device (...): skipping", as the CUDA backend's do (the concept checks still run). main() is
// conformance_mpi_main.cpp's.

#include <array>
#include <asio/io_context.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "conformance/conformance_adapter.hpp"
#include "conformance/conformance_mpi.hpp"
#include "eredu/core/dtype.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/cuda/pinned_registration.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/nccl/backend.hpp"
#include "eredu/nccl/communicator.hpp"

namespace eredu::test {

/// The NCCL backend's conformance adapter (device 0).
struct NcclAdapter : ConformanceDefaults<nccl::Backend> {
  static constexpr const char* name = "nccl";  ///< for WARN messages
  static constexpr bool transfer = true;       ///< claims TransferBackend (cuda::Backend's)
  static constexpr bool in_place = false;      ///< no overwrite: not an InPlaceBackend
  static constexpr bool collective = true;     ///< claims CollectiveBackend
  static constexpr bool gather_into = true;    ///< claims GatherIntoBackend
  /// What nccl/backend.hpp says all_reduce reduces with sum, min and max (of the suite's dtypes).
  static constexpr std::array reduced_dtypes{DType::F32, DType::BF16, DType::F16, DType::I32, DType::U8};
  /// What it refuses with every reduction: FP8 is none of the types eredu maps to NCCL's.
  static constexpr std::array refused_dtypes{DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0};
  /// "" with a device; otherwise why none can be used (as tests/cuda/test_cuda_gpu.cpp says it).
  static std::string unavailable() {
    return cuda::device_count() > 0 ? std::string() : "no CUDA device (" + cuda::no_device_reason() + ")";
  }
  /// One stream, a device pool, the source's staging pool page-locked (unpinned before the
  /// source goes: the Env is destroyed first), and a group of one rank on device 0: this
  /// process's MPI group, split from the world, as an NCCL communicator.
  struct Env {
    Env(asio::io_context&, io::CheckpointSource& source)
        : memory(0),
          pin(cuda::pin_staging(source)),
          bootstrap(conformance_world().split(conformance_world().rank(), 0, "conformance")),
          solo(nccl::Communicator::create(bootstrap, 0)) {}
    cuda::MaterializationContext& context() { return mc; }
    cuda::Executor& executor() { return stream; }
    nccl::Communicator& group() { return solo; }
    cuda::Executor stream{0};
    cuda::DeviceMemoryPool memory;
    cuda::PinnedRegistration pin;
    cuda::MaterializationContext mc{stream, memory, &pin};
    mpi::Communicator bootstrap;  ///< the MPI group the NCCL one was made over
    nccl::Communicator solo;      ///< destroyed first; goes with its last collective in flight
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

#define EREDU_CONFORMANCE_ADAPTERS eredu::test::NcclAdapter
#include "conformance/backend_conformance.hpp"
