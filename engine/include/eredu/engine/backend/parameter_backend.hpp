#pragma once
/// \file
/// The ParameterBackend concept: what a backend provides so that the engine can
/// materialize checkpoint tensors into its native weights and bind them to module slots
/// (the seed's `ParameterBackend` trait, backend.rs).
///
/// Differences from the seed, and why:
///  * `materialize` receives the read request, not a lease already read: a backend that owns
///    its final memory reads straight into it (one copy from the page cache, no staging
///    copy); a backend that needs staging asks the source for leases itself. Either way the
///    leases it holds are released exactly when its Materialization completes.
///  * Materializations are asynchronous: each exposes a Completion; `finish_materialization`
///    is called only once that completion is ready (it never blocks).
///  * A std::stop_token lets the orchestration stop the other tensors of a unit once one
///    has failed; a stopped materialization completes with eredu::errc::cancelled.
///  * Errors are exceptions (eredu::Error subclasses); `bind` is noexcept because it must not
///    fail after `validate_bind` succeeded.

#include <concepts>
#include <stop_token>

#include "eredu/core/completion.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"

namespace eredu::engine {

/// A backend that materializes checkpoint data read from `Source` (any io::ByteSource; a
/// local checkpoint unless named) and binds it to its parameter slots.
///
/// - `B::Parameter`: one native parameter slot of a module;
/// - `B::MaterializedWeight`: a realized weight, ready to bind;
/// - `B::MaterializationContext`: what the backend needs while realizing (pools, executors);
/// - `B::Materialization`: an in-flight realization that retains its leases until it completes.
template <class B, class Source = io::CheckpointSource>
concept ParameterBackend = io::ByteSource<Source> && requires {
  typename B::Parameter;
  typename B::MaterializedWeight;
  typename B::MaterializationContext;
  typename B::Materialization;
} && requires(Source& source, const io::TensorReadRequest& request, const DerivedWeightRecipe& recipe,
              typename B::MaterializationContext& context, std::stop_token stop, typename B::Materialization& in_flight,
              const typename B::Materialization& const_in_flight, const typename B::MaterializedWeight& weight,
              typename B::MaterializedWeight& owned_weight, const typename B::Parameter& parameter,
              typename B::Parameter& slot) {
  // Starts realizing a format-preserving tensor read (checkpoint dtype kept).
  { B::materialize(source, request, context, stop) } -> std::same_as<typename B::Materialization>;
  // Starts realizing a validated recipe.
  { B::materialize_recipe(source, recipe, context, stop) } -> std::same_as<typename B::Materialization>;
  // The exact completion of an in-flight realization.
  { B::completion(const_in_flight) } -> std::same_as<Completion>;
  // The weight an in-flight realization is producing.
  { B::materialized_weight(const_in_flight) } -> std::same_as<const typename B::MaterializedWeight&>;
  // After completion: the weight, or the realization's error thrown.
  { B::finish_materialization(std::move(in_flight)) } -> std::same_as<typename B::MaterializedWeight>;
  // Another handle to the same storage (aliases), never a copy or a re-read.
  { B::share_materialized_weight(weight) } -> std::same_as<typename B::MaterializedWeight>;
  // Throws eredu::BackendError when the weight cannot be bound to the slot.
  B::validate_bind(parameter, weight);
  // Publishes the weight into the slot; cannot fail after validate_bind.
  { B::bind(slot, std::move(owned_weight)) }
  noexcept;
};

}  // namespace eredu::engine
