// The backend conformance suite on the MPI backend (mpi::Backend: the CPU backend with
// collectives over MPI), its collective cases over a group of one rank: this process's own,
// split from the world, so they run as a plain ctest process (MPI's singleton start) and under
// mpirun alike. main() is conformance_mpi_main.cpp's.

#include <array>
#include <asio/io_context.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "conformance/conformance_adapter.hpp"
#include "conformance/conformance_mpi.hpp"
#include "eredu/core/dtype.hpp"
#include "eredu/mpi/backend.hpp"
#include "eredu/mpi/communicator.hpp"
#include "support/checkpoint_fixture.hpp"

namespace eredu::test {

/// The MPI backend's conformance adapter.
struct MpiAdapter : ConformanceDefaults<mpi::Backend> {
  static constexpr const char* name = "mpi";  ///< for WARN messages
  static constexpr bool transfer = true;      ///< claims TransferBackend (cpu::Backend's)
  static constexpr bool in_place = true;      ///< claims InPlaceBackend (cpu::Backend's)
  static constexpr bool collective = true;    ///< claims CollectiveBackend
  static constexpr bool gather_into = true;   ///< claims GatherIntoBackend
  /// What mpi/backend.hpp says all_reduce reduces with sum, min and max (of the suite's dtypes).
  static constexpr std::array reduced_dtypes{DType::F32, DType::BF16, DType::F16, DType::I32, DType::U8};
  /// What it refuses with every reduction: no MPI type or operation for FP8.
  static constexpr std::array refused_dtypes{DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0};
  /// Always available (MPI starts as a singleton without mpirun).
  static std::string unavailable() { return {}; }
  /// An arena of two threads, a storage pool, and a group of one rank: this process, split
  /// from the world (the whole world too when run without mpirun).
  struct Env {
    Env(asio::io_context&, io::CheckpointSource&)
        : solo(conformance_world().split(conformance_world().rank(), 0, "conformance")) {}
    cpu::MaterializationContext& context() { return mc; }
    cpu::Executor& executor() { return arena; }
    mpi::Communicator& group() { return solo; }
    cpu::Executor arena{2};
    cpu::StoragePool storage;
    cpu::MaterializationContext mc{arena, storage};
    mpi::Communicator solo;  ///< freed after its collectives, never blocking
  };
  /// The tensor's bytes.
  static std::vector<std::byte> host_bytes(const cpu::Tensor& t) { return to_vector(t.bytes()); }
  /// Where they live.
  static const void* address(const cpu::Tensor& t) { return t.bytes().data(); }
};

}  // namespace eredu::test

#define EREDU_CONFORMANCE_ADAPTERS eredu::test::MpiAdapter
#include "conformance/backend_conformance.hpp"
