#pragma once
/// \file
/// The swap core: the one coroutine every model slot runs for a swap, written once —
/// claim → load → verify → canary → commit → publish → retire — over a policy that supplies
/// what differs between the slots:
///
///  * where the new version is loaded (`load`: a private model for ModelSlot and
///    DistributedModelSlot, staging weights for InPlaceModelSlot) and what the load does not
///    check itself (`validate`), and the model the canary probes (`canary`);
///  * how it is committed (`commit`: at once on this process — commit_locally — or by a vote of
///    every rank of a group, which must hear from this rank whatever failed before it);
///  * how it is published (`publish`: one pointer store, the gate and an in-place copy, or the
///    decision the vote already applied) and what retiring the version it replaced takes
///    (`retire`).
///
/// Every step is timed in the policy's report (a SwapReport or one derived from it); every
/// failure before the publication leaves the serving version untouched. Steps 2 and 3 are
/// detail/swap_steps.hpp; the policies are detail/double_buffered_swap.hpp,
/// detail/in_place_swap.hpp and detail/distributed_swap.hpp.
///
/// The source is any io::ByteSource the backend reads from (ParameterBackend<B, Source>): the
/// core asks it for its catalog and executor only, and the load reads it through
/// materialize_unit, which refuses before any read the one step a non-checkpoint source
/// cannot serve (checksums that need re-reading the file).

#include <asio/associated_allocator.hpp>
#include <asio/awaitable.hpp>
#include <asio/this_coro.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/detail/load_unit.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/orchestration/materialize_options.hpp"
#include "eredu/engine/serving/model_version.hpp"
#include "eredu/engine/serving/swap_options.hpp"
#include "eredu/io/reading/byte_source.hpp"

namespace eredu::engine::detail {

/// What one swap was asked for, held by the swap for its whole run (the caller's source and
/// context outlive it; the plan is the swap's own copy). `Source` is any io::ByteSource.
template <io::ByteSource Source, class Context, class Model>
struct SwapRequest {
  Source* source = nullptr;                         ///< where the new version is read from
  std::shared_ptr<const WeightBindingPlan> plan{};  ///< what it binds
  Context* context = nullptr;                       ///< the backend's (throttled) materialization context
  SwapOptions<Model> options{};                     ///< origin, checksums, canary, progress
  /// When set, the cancellation the swap checks between its steps: for a swap whose coroutine
  /// runs without the caller's cancellation slot (a distributed swap). Else the coroutine's.
  std::shared_ptr<const std::atomic<bool>> cancelled{};
};

/// The swap's own copy of `plan`, allocated with `handler`'s associated allocator (the swap's
/// per-operation state, kept until it ends).
template <class Handler>
std::shared_ptr<const WeightBindingPlan> plan_for(const Handler& handler, const WeightBindingPlan& plan) {
  return std::allocate_shared<WeightBindingPlan>(asio::get_associated_allocator(handler), plan);
}

/// The commit of a slot that answers to no one else: a failure of the earlier steps is the
/// swap's own, and the new version goes on to its publication at once.
template <class Staged>
asio::awaitable<Staged> commit_locally(std::optional<Staged> staged, std::exception_ptr failure) {
  if (failure) std::rethrow_exception(failure);
  co_return std::move(*staged);
}

/// The steps up to the commit of a slot that swaps whole model objects (ModelSlot,
/// DistributedModelSlot), for its policy to derive from: nothing to refuse up front; the load
/// makes a new model, private to the swap, and loads and binds `request`'s plan into it (the
/// bind validates every weight, so nothing is left to verify after it; on failure the partly
/// bound model is dropped); the canary probes that model.
template <ParameterBackend B, class Model>
struct NewModelSteps {
  using Version = ModelVersion<Model>;      ///< what the slot commits
  using Staged = std::shared_ptr<Version>;  ///< the private new version

  const std::function<Model()>& make_model;  ///< the slot's factory (outlives the swap)

  /// Any plan may be tried: the load and the bind check it.
  void admit(const WeightBindingPlan&, std::uint64_t) const noexcept {}
  /// Loads into a new private model.
  template <io::ByteSource Source>
  asio::awaitable<Staged> load(const SwapRequest<Source, typename B::MaterializationContext, Model>& request,
                               MaterializeOptions materialize) const requires ParameterBackend<B, Source> {
    auto next = std::make_shared<Version>(Version{make_model(), 0, request.options.origin});
    co_await load_unit<B>(next->model, *request.source, request.plan, *request.context, std::move(materialize), true);
    co_return next;
  }
  /// Nothing to add: binding the load validated every weight against its slot.
  void validate(const Staged&) const noexcept {}
  /// The canary probes the new model itself.
  template <class Run>
  asio::awaitable<void> canary(const Staged& next, Run run) const {
    co_await run(std::as_const(next->model));
  }
};

/// Runs one swap of the slot `policy` stands for (see file comment). `Policy` has:
///  - `Report`, `Staged` (the private new version) and `Committed` (what the commit gives the
///    publication);
///  - `what` ("swap", "in-place swap"...: the messages' name of the swap) and
///    `check_after_canary` (whether cancellation is checked right after the canary, or by the
///    publication itself);
///  - `swapping()`, the slot's claim flag, and `serving_generation()`;
///  - `admit(plan, serving)`: refuses a request before anything is read;
///  - `load(request, materialize)` → awaitable<Staged>, `validate(staged)`,
///    `canary(staged, run)` → awaitable<void> (calls `run(model)` on the model to probe);
///  - `commit(optional<Staged>, failure, report)` → awaitable<Committed>;
///  - `publish(committed, serving, cancellation, report)` and `retire(committed)` → awaitable<void>.
template <class Policy, io::ByteSource Source, class Context, class Model>
asio::awaitable<typename Policy::Report> run_swap(Policy policy, SwapRequest<Source, Context, Model> request) {
  // Claim: one swap of a slot at a time (a second one fails here, before any step).
  SwapClaim claim(policy.swapping(), request.options.origin);
  co_await asio::this_coro::throw_if_cancelled(false);
  asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
  const std::uint64_t serving = policy.serving_generation();
  const SwapCancellation cancellation = request.cancelled
                                            ? SwapCancellation(std::move(request.cancelled), Policy::what, serving)
                                            : SwapCancellation(std::move(cancel_state), Policy::what, serving);
  typename Policy::Report report;
  std::optional<typename Policy::Staged> staged;
  std::exception_ptr failure;
  try {
    policy.admit(*request.plan, serving);

    // Load, with the checksums verified inside it, each tensor as it lands.
    const SwapClock::time_point t = SwapClock::now();
    MaterializeProgress own_counters;
    MaterializeOptions materialize = swap_load_options(request.options, own_counters);
    const std::uint64_t verified_before = materialize.progress->bytes_verified.load();
    staged.emplace(co_await policy.load(request, materialize));
    report.load_s = seconds_since(t);
    report.verified_bytes = materialize.progress->bytes_verified.load() - verified_before;
    trace_step("load", t);
    report.bytes = plan_bytes(*request.plan, request.source->catalog());

    // Verify what the load did not: the staged weights against the serving model's slots.
    policy.validate(*staged);
    cancellation.check("after the load");

    // The canary, on the new version while nobody can read it.
    if (request.options.canary) {
      co_await policy.canary(*staged, [&](const Model& model) {
        return canary_step<Model>(request.options.canary, model, serving, report);
      });
      if constexpr (Policy::check_after_canary) cancellation.check("after the canary");
    }
  } catch (...) {
    failure = std::current_exception();
    staged.reset();  // a partly loaded version goes now, before any vote
  }

  // Commit (here, or by the group), publish, and retire what the publication replaced.
  typename Policy::Committed committed = co_await policy.commit(std::move(staged), std::move(failure), report);
  co_await policy.publish(committed, serving, cancellation, report);
  co_await policy.retire(committed);
  co_return report;
}

}  // namespace eredu::engine::detail
