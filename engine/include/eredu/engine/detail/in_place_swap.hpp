#pragma once
/// \file
/// InPlaceModelSlot's state and its policy over the swap core (swap_core.hpp): the new version
/// is staged (the backend's storage, through the bounded lease pool), validated against the
/// serving model's slots, probed by the canary on a staged model sharing the staging weights,
/// committed at once, and published by closing the gate (in_place_gate.hpp), draining the
/// requests in flight, copying every owner weight into its bound storage and reopening. A
/// failed copy tears the gate: the slot does not serve a mix of versions.

#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/backend/in_place_backend.hpp"
#include "eredu/engine/detail/materialize_unit.hpp"
#include "eredu/engine/detail/swap_core.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/orchestration/bind.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/serving/swap_options.hpp"
#include "eredu/io/integrity/block_digests.hpp"

namespace eredu::engine::detail {

/// A plan's tied weights, as (alias, owner) pairs: an in-place swap must keep them.
using InPlaceAliases = std::set<std::pair<ParameterId, ParameterId>>;

/// The (alias, owner) pairs of `plan`.
inline InPlaceAliases aliases_of(const WeightBindingPlan& plan) {
  InPlaceAliases out;
  for (auto [alias, owner] : plan.aliases()) out.emplace(alias->id(), owner->id());
  return out;
}

/// Closes `gate` to new readers and waits for the requests in flight, recording the wait in
/// `report`; returns when it closed, from which the pause is timed. `gate` outlives the wait.
template <class Gate>
asio::awaitable<SwapClock::time_point> close_for_write(const std::shared_ptr<Gate>& gate, SwapReport& report) {
  const SwapClock::time_point closed = SwapClock::now();
  co_await Gate::close_and_drain(gate);
  report.readers_drained = SwapClock::now() - closed;
  trace_step("drain readers", closed);
  co_return closed;
}

/// What an InPlaceModelSlot holds: its factory, the gate around the serving model, the
/// serving version's aliasing and its claim flag. `Gate` is the slot's InPlaceGate.
template <class Model, class Gate>
struct InPlaceState {
  std::function<Model()> make_model;  ///< makes an empty model with every slot declared
  std::shared_ptr<Gate> gate;         ///< the serving model and its reader/writer gate
  InPlaceAliases aliases{};           ///< the serving version's (alias, owner) pairs
  std::atomic<bool> swapping{false};  ///< a swap holds the slot (SwapClaim)
  /// The block digests of serving owners' bytes, as the last patch checked them (a swap
  /// forgets them): a later patch of a delta hashes only the blocks it changes
  /// (in_place_patch.hpp). Touched only by the swap or patch that holds the claim.
  std::map<ParameterId, io::BlockDigests> block_digests{};
};

/// InPlaceModelSlot's swap policy (see file comment and run_swap's requirements).
template <ParameterBackend B, class Model, class Gate>
requires InPlaceBackend<B>
struct InPlaceSwap {
  using Report = SwapReport;                            ///< what a swap reports
  using Staged = MaterializedUnit<B>;                   ///< the staged new set
  using Committed = Staged;                             ///< the same, once committed
  static constexpr const char* what = "in-place swap";  ///< the swap's name in messages
  static constexpr bool check_after_canary = false;     ///< publish checks, before the copy

  InPlaceState<Model, Gate>* state;               ///< the slot's (outlives the swap)
  typename B::Executor* executor;                 ///< runs the copy
  std::shared_ptr<const WeightBindingPlan> plan;  ///< the swap's plan (its owners and aliases)

  /// The slot's claim flag.
  std::atomic<bool>& swapping() const noexcept { return state->swapping; }
  /// The generation the serving weights hold.
  std::uint64_t serving_generation() const { return Gate::current_generation(state->gate); }
  /// Refuses a plan whose aliasing differs from the serving version's.
  void admit(const WeightBindingPlan& p, std::uint64_t serving) const {
    if (serving > 0 && aliases_of(p) != state->aliases)
      throw OrchestrationError(errc::invalid_argument, {},
                               "an in-place swap needs the serving version's aliasing (the same tied weights)");
  }
  /// Stages the complete new set.
  template <io::ByteSource Source>
  asio::awaitable<Staged> load(const SwapRequest<Source, typename B::MaterializationContext, Model>& request,
                               const MaterializeOptions& materialize) const requires ParameterBackend<B, Source> {
    return materialize_unit<B>(*request.source, request.plan, *request.context, materialize, true);
  }
  /// Validates the staged set against the serving model's declarations (which never change).
  void validate(const Staged& unit) const { validate_materialized_unit<B>(state->gate->model, unit.weights()); }
  /// The canary probes a staged model sharing the staging weights.
  template <class Run>
  asio::awaitable<void> canary(Staged& unit, Run run) const {
    Model staged = state->make_model();
    typename MaterializedUnit<B>::Weights shared;
    for (auto& [id, weight] : unit.weights()) shared.emplace(id, B::share_materialized_weight(weight));
    bind_materialized_unit<B>(staged, MaterializedUnit<B>(std::move(shared)));
    co_await run(std::as_const(staged));
  }
  /// At once.
  asio::awaitable<Committed> commit(std::optional<Staged> staged, std::exception_ptr failure, Report&) const {
    return commit_locally(std::move(staged), std::move(failure));
  }
  /// Closes the gate, drains the requests in flight, copies, reopens.
  asio::awaitable<void> publish(Committed& unit, std::uint64_t serving, const SwapCancellation& cancellation,
                                Report& report) const {
    cancellation.check("before the copy");
    const SwapClock::time_point closed = co_await close_for_write(state->gate, report);
    state->block_digests.clear();  // the bytes they digest are about to be replaced

    std::exception_ptr copy_error;
    if (serving == 0) {
      // Nothing bound yet: the staged weights become the model's (validated: cannot fail).
      bind_materialized_unit<B>(state->gate->model, std::move(unit));
      state->aliases = aliases_of(*plan);
    } else {
      try {
        co_await copy_owners(unit);
      } catch (...) {
        copy_error = std::current_exception();
      }
    }
    std::exception_ptr torn;
    if (copy_error)
      torn = std::make_exception_ptr(BackendError(
          errc::backend_failure, {},
          fmt::format("an in-place swap failed during its final copy, so the weights are neither version {} nor "
                      "the new one; reads fail until a swap succeeds",
                      serving)));
    report.publish_pause = SwapClock::now() - closed;
    trace_step("publish in place", closed);
    report.generation = serving + 1;
    Gate::open(state->gate, std::move(torn));
    if (copy_error) std::rethrow_exception(copy_error);
  }
  /// Nothing: the old version's bytes were overwritten where they lay.
  asio::awaitable<void> retire(Committed&) const { co_return; }

  /// Copies every owner's staged weight into its bound slot (aliases share the owner's
  /// storage and so follow), each copy parallel on the executor, all awaited.
  asio::awaitable<void> copy_owners(const MaterializedUnit<B>& unit) const {
    std::set<ParameterId> owners;
    for (const WeightBinding* owner : plan->owners()) owners.insert(owner->id());
    struct Copier final : ParameterVisitorMut<typename B::Parameter> {
      Copier(const std::set<ParameterId>& o, const MaterializedUnit<B>& u, typename B::Executor& e)
          : owners(o), unit(u), executor(e) {}
      void visit_mut(const ParameterMetadata& metadata, typename B::Parameter& parameter) override {
        if (!owners.contains(metadata.id)) return;
        try {
          copies.push_back(B::overwrite(executor, parameter, *unit.find(metadata.id)));
        } catch (...) {
          copies.push_back(Completion::failed(attach_parameter(std::current_exception(), metadata.id.str())));
        }
      }
      const std::set<ParameterId>& owners;
      const MaterializedUnit<B>& unit;
      typename B::Executor& executor;
      std::vector<Completion> copies;
    } copier(owners, unit, *executor);
    state->gate->model.visit_parameters_mut(copier, std::string());
    co_await when_all(copier.copies).async_wait(asio::use_awaitable);
  }
};

}  // namespace eredu::engine::detail
