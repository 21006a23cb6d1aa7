// The one table of backend requirements (engine/backend/backend_requirements.hpp) read for
// each backend built here: which optional rows it meets, and what its buffers declare.
#include "eredu/engine/backend/backend_requirements.hpp"

#include <catch2/catch.hpp>

#include "eredu/cpu/backend.hpp"
#include "support/fake_backend.hpp"

using namespace eredu;
using namespace eredu::engine;

namespace {
/// A backend with slots only: the required row and nothing else.
struct MinimalBackend {
  using Parameter = cpu::Parameter;
  using MaterializedWeight = cpu::Tensor;
  using MaterializationContext = cpu::MaterializationContext;
  using Materialization = cpu::Materialization;
  static Materialization materialize(io::CheckpointSource& s, const io::TensorReadRequest& r, MaterializationContext& c,
                                     std::stop_token t) {
    return cpu::Backend::materialize(s, r, c, std::move(t));
  }
  static Materialization materialize_recipe(io::CheckpointSource& s, const DerivedWeightRecipe& r,
                                            MaterializationContext& c, std::stop_token t) {
    return cpu::Backend::materialize_recipe(s, r, c, std::move(t));
  }
  static Completion completion(const Materialization& m) { return m.done; }
  static const cpu::Tensor& materialized_weight(const Materialization& m) { return m.weight; }
  static cpu::Tensor finish_materialization(Materialization&& m) {
    return cpu::Backend::finish_materialization(std::move(m));
  }
  static cpu::Tensor share_materialized_weight(const cpu::Tensor& w) { return w; }
  static void validate_bind(const Parameter& p, const cpu::Tensor& w) { cpu::Backend::validate_bind(p, w); }
  static void bind(Parameter& p, cpu::Tensor&& w) noexcept { p.value = std::move(w); }
};
}  // namespace

TEST_CASE("backend requirements: the CPU backend meets every row but the collective ones") {
  constexpr BackendFeatures f = backend_features<cpu::Backend>();
  STATIC_REQUIRE(f.parameters);
  STATIC_REQUIRE(f.buffer_traits);
  STATIC_REQUIRE(f.submission);
  STATIC_REQUIRE(f.verifying);
  STATIC_REQUIRE(f.reserving);
  STATIC_REQUIRE(f.transfer);
  STATIC_REQUIRE(f.in_place);
  STATIC_REQUIRE(f.patching);
  STATIC_REQUIRE_FALSE(f.collective);
  STATIC_REQUIRE_FALSE(f.voting);
  constexpr BufferTraits traits = buffer_traits_of<cpu::Backend>();
  STATIC_REQUIRE(traits.host);
  STATIC_REQUIRE(traits.reads_into);
  STATIC_REQUIRE(traits.adopts_mappings);
  STATIC_REQUIRE(traits.lays_out_windows);
}

TEST_CASE("backend requirements: the fake backend's buffers take whole leases, so every read is staged") {
  constexpr BackendFeatures f = backend_features<test::FakeBackend>();
  STATIC_REQUIRE(f.parameters);
  STATIC_REQUIRE(f.submission);
  STATIC_REQUIRE(f.buffer_traits);
  STATIC_REQUIRE_FALSE(f.reserving);  // its tensors are vectors: nothing to map ahead
  constexpr BufferTraits traits = buffer_traits_of<test::FakeBackend>();
  STATIC_REQUIRE_FALSE(traits.reads_into);
  STATIC_REQUIRE(traits.whole_leases);
  // Whatever the source offers and the policy asks, the planner stages one lease per read.
  const PlacementPlan plan = plan_placement(io::SourceCapabilities{.maps_pages = true, .direct_windows = true}, traits,
                                            PlacementPolicy{.map_weights = true}, OwnerBytes{.bytes = 1 << 20});
  REQUIRE(plan.landings().size() == 1);
  CHECK(plan.landings().front() == Landing::staged_lease);
}

TEST_CASE("backend requirements: a backend with slots only meets the one required row") {
  constexpr BackendFeatures f = backend_features<MinimalBackend>();
  STATIC_REQUIRE(f == BackendFeatures{.parameters = true});
  STATIC_REQUIRE_FALSE(backend_features<int>().parameters);
  // It declares no buffers: the planner streams chunk leases into them, which every source serves.
  constexpr BufferTraits traits = buffer_traits_of<MinimalBackend>();
  STATIC_REQUIRE_FALSE(traits.reads_into);
  STATIC_REQUIRE_FALSE(traits.whole_leases);
  const PlacementPlan plan =
      plan_placement(io::SourceCapabilities{.maps_pages = true}, traits, PlacementPolicy{}, OwnerBytes{.bytes = 64});
  CHECK(plan.landings().front() == Landing::chunk_stream);
}
