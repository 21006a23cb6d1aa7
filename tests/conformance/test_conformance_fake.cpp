// The backend conformance suite on the fake backend (support/fake_backend.hpp), reading through
// the real source and pool. Its recipes are evaluated with the reference evaluator itself, so
// here the recipe case checks the plumbing (the recipe reaches the backend whole, every source
// is read, every lease comes back), not independent arithmetic.

#include <asio/io_context.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "conformance/conformance_adapter.hpp"
#include "support/checkpoint_fixture.hpp"
#include "support/fake_backend.hpp"

namespace eredu::test {

/// The fake backend's conformance adapter.
struct FakeAdapter : ConformanceDefaults<FakeBackend> {
  static constexpr const char* name = "fake";  ///< for WARN messages
  static constexpr bool transfer = true;       ///< claims TransferBackend
  static constexpr bool in_place = true;       ///< claims InPlaceBackend
  static constexpr bool collective = false;    ///< no collectives: not a CollectiveBackend
  static constexpr bool gather_into = false;   ///< nor a GatherIntoBackend
  /// Always available.
  static std::string unavailable() { return {}; }
  /// A device on the test's loop, reading through the pool, and one executor of it.
  struct Env {
    Env(asio::io_context& ctx, io::CheckpointSource&) : device(ctx.get_executor()), lane(device) {}
    FakeDevice& context() { return device; }
    FakeExecutor& executor() { return lane; }
    FakeDevice device;
    FakeExecutor lane;
  };
  /// The weight's bytes.
  static std::vector<std::byte> host_bytes(const FakeWeight& w) { return to_vector(w.bytes()); }
  /// Where they live.
  static const void* address(const FakeWeight& w) { return w.data(); }
};

}  // namespace eredu::test

#define EREDU_CONFORMANCE_ADAPTERS eredu::test::FakeAdapter
#include "conformance/backend_conformance.hpp"
