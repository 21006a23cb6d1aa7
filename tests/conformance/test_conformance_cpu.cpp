// The backend conformance suite on the oneTBB CPU backend.

#include <asio/io_context.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "conformance/conformance_adapter.hpp"
#include "cpu/cpu_fixture.hpp"
#include "eredu/cpu/backend.hpp"

namespace eredu::test {

/// The CPU backend's conformance adapter.
struct CpuAdapter : ConformanceDefaults<cpu::Backend> {
  static constexpr const char* name = "cpu";  ///< for WARN messages
  static constexpr bool transfer = true;      ///< claims TransferBackend
  static constexpr bool in_place = true;      ///< claims InPlaceBackend
  static constexpr bool collective = false;   ///< no collectives: not a CollectiveBackend
  static constexpr bool gather_into = false;  ///< nor a GatherIntoBackend
  /// Always available.
  static std::string unavailable() { return {}; }
  /// An arena of two threads (so its work really runs in parallel) and a storage pool.
  struct Env {
    Env(asio::io_context&, io::CheckpointSource&) {}
    cpu::MaterializationContext& context() { return mc; }
    cpu::Executor& executor() { return arena; }
    cpu::Executor arena{2};
    cpu::StoragePool storage;
    cpu::MaterializationContext mc{arena, storage};
  };
  /// The tensor's bytes.
  static std::vector<std::byte> host_bytes(const cpu::Tensor& t) { return to_vector(t.bytes()); }
  /// Where they live.
  static const void* address(const cpu::Tensor& t) { return t.bytes().data(); }
};

}  // namespace eredu::test

#define EREDU_CONFORMANCE_ADAPTERS eredu::test::CpuAdapter
#include "conformance/backend_conformance.hpp"
