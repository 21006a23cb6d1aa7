#pragma once
/// \file
/// eredu::engine::DistributedModelSlot: the serving version of a model sharded across the ranks
/// of a group (tensor parallelism), swapped for a new version on every rank or on none, at the
/// same step on every rank, with a rollback that follows the same rule.
///
/// \code
///   // every rank of `tp`, in the same order
///   engine::DistributedModelSlot<cpu::Backend, Model, mpi::Backend> slot(make_model, tp);
///   // the serving loop: one version per step, the same on every rank
///   for (std::uint64_t step = 0;; ++step) {
///     std::shared_ptr<const auto> v = slot.version_for_step(step);
///     serve(v->model, step);  // its all_reduce calls see the same version on every rank
///   }
///   // a swap, in the background on every rank: each loads and checks its own shard, then votes
///   engine::DistributedSwapReport r = co_await slot.async_swap(*source, my_shard_plan, background, options,
///                                                              asio::use_awaitable);
///   co_await slot.async_rollback(source->get_executor(), asio::use_awaitable);  // back to the version before, on
///   every rank
///   // a rank whose source does not open still votes, so the others fail now, not at their timeout
///   co_await slot.async_decline(std::current_exception(), executor, asio::use_awaitable);  // throws rank_failed
/// \endcode
///
/// What a swap does on each rank, and why:
///  1. Loads, verifies and checks its shard of the new version into a private model, exactly
///     as ModelSlot does (bounded staging, the caller's throttled context, checksums verified
///     as tensors land, the canary). Any failure — a missing tensor, a wrong shape, EIO, a
///     checksum, the canary, a cancellation — is caught here, not thrown: the rank must still
///     vote, or the others would wait for it until their timeout.
///  2. Votes: one all_gather of every rank's Ballot (group_vote.hpp) over the voting backend's
///     group (mpi::Backend for CPU and GPU ranks alike: ballots are host bytes), waiting at
///     most DistributedSlotOptions::vote_timeout for ranks still loading. While this rank's
///     ballot is out it begins no new step: version_for_step() for a step not yet begun waits
///     for the decision — which comes once the last rank has voted, so a serving loop whose
///     steps are collectives is held at most until the slowest rank's load ends, and a loop on
///     one rank waits only for that vote (tens of microseconds once all have voted).
///  3. Decides, on every rank from the same ballots: commit only if every rank succeeded and
///     all serve the same generation. The new version's generation is one more than the
///     highest any rank has committed, and it starts at step `max(fence)` — the first step that
///     no rank had begun when it voted — so every rank serves every step with the same
///     version: steps before it with the old one, from it on with the new one. Otherwise every
///     rank keeps its version, untouched, and fails with CollectiveError(rank_failed) naming
///     each failed rank and its own error kind and message — the same message on every rank.
///  4. Keeps the version it replaced (unless DistributedSlotOptions::keep_previous is false)
///     for async_rollback, until release_previous() or the next swap.
///
/// The swap is the swap core every slot runs (detail/swap_core.hpp) with this slot's policy
/// (detail/distributed_swap.hpp), whose commit is the vote. The cost of the vote and decision
/// (DistributedSwapReport::commit_s) is measured in bench/swap_commit.cpp.
///
/// What the protocol cannot do: if this rank's wait for the vote runs out (a peer stalled or
/// died) it keeps its version and fails with collective_error; a peer that received every
/// ballot just before (only possible when this rank stalled for the whole timeout between
/// casting its ballot and receiving the others') may have committed. The vote's group is then
/// unusable, as after any timeout, so no later vote or collective on it can pretend otherwise;
/// the generations the ranks report (current()->generation) say which version each serves.
///
/// Rules: call async_swap (or, on a rank that cannot run it, async_decline) and async_rollback
/// on every rank of the group in the same order, one at a time (await each before the next),
/// as with any collective. Steps begin in order on a rank (version_for_step with
/// non-decreasing steps; several threads may ask for the same step). The slot and the group
/// must outlive the slot's operations.

#include <asio/any_io_executor.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_allocator.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <utility>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/detail/distributed_swap.hpp"
#include "eredu/engine/detail/swap_core.hpp"
#include "eredu/engine/parallel/group_vote.hpp"
#include "eredu/engine/serving/model_version.hpp"
#include "eredu/engine/serving/swap_options.hpp"

namespace eredu::engine {

/// The serving version of a sharded model across a group (see file comment). Thread-safe:
/// current() and version_for_step() from any thread; swaps run on the source's executor,
/// rollbacks on the executor they are given.
template <ParameterBackend B, class Model, VotingBackend C>
requires Parameterized<Model, typename B::Parameter>
class DistributedModelSlot {
 public:
  /// A committed version (the same type ModelSlot publishes).
  using Version = ModelVersion<Model>;
  /// Makes an empty model with every slot of this rank's shard declared and nothing bound.
  using Factory = std::function<Model()>;

  /// An empty slot whose swaps vote over `group`: no version until the first swap.
  DistributedModelSlot(Factory make_model, typename C::Group& group, DistributedSlotOptions options = {})
      : state_(std::move(make_model), group, options) {}
  DistributedModelSlot(const DistributedModelSlot&) = delete;
  DistributedModelSlot& operator=(const DistributedModelSlot&) = delete;

  /// The version the latest committed swap or rollback chose (null before the first), whatever
  /// step this rank is at: for readers outside the step protocol. A tensor-parallel forward
  /// takes its version from version_for_step instead.
  std::shared_ptr<const Version> current() const { return state_.current(); }

  /// The version kept for rollback (null when none).
  std::shared_ptr<const Version> previous() const { return state_.previous(); }

  /// Generation of current() (0 before the first swap).
  std::uint64_t generation() const { return state_.generation(); }

  /// True while a swap or rollback is running on this rank.
  bool swapping() const noexcept { return state_.swapping.load(std::memory_order_acquire); }

  /// The version that serves `step` — the same on every rank of the group (see file comment).
  /// Blocks only while a vote is in flight and `step` has not begun on this rank yet, until
  /// the decision (at most the group's timeout).
  std::shared_ptr<const Version> version_for_step(std::uint64_t step) { return state_.version_for_step(step); }

  /// Drops the version kept for rollback on this rank (its storage returns to its pool once
  /// no step still uses it). A later rollback then fails on every rank (this one votes no).
  void release_previous() { state_.release_previous(); }

  /// Loads this rank's shard of a new version from `source`, votes, and commits it on every
  /// rank or on none (see file comment).
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, DistributedSwapReport)`. Errors: CollectiveError(rank_failed)
  /// when any rank failed its load, checksums or canary or was cancelled (every rank fails
  /// alike, naming each failed rank and its cause), or when the ranks serve different
  /// generations; CollectiveError(collective_error) when the vote itself failed or timed out;
  /// OrchestrationError(swap_in_progress) for a second swap of this slot while one runs
  /// (that one casts no ballot). After any of them every rank serves what it served before.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, before the vote: this rank votes no (cancelled) and every rank keeps its
  /// version. Once the ballots are cast the decision is every rank's, and is not undone.
  ///
  /// `source` is any io::ByteSource B reads from, as for ModelSlot::async_swap: from a source
  /// other than a local checkpoint, checksums that need re-reading the file (a recipe's
  /// source tensors, or any tensor on a backend that cannot hash its weights where they land)
  /// fail this rank's load with invalid_argument before any read, which it votes like any
  /// other failure.
  ///
  /// `source`, `context` and `options.progress` must outlive the operation; the plan is copied.
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, DistributedSwapReport)> Token>
  requires ParameterBackend<B, Source>
  auto async_swap(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                  SwapOptions<Model> options, Token&& token) {
    using Context = typename B::MaterializationContext;
    return asio::async_initiate<Token, void(std::exception_ptr, DistributedSwapReport)>(
        [](auto handler, State* state, Source* src, const WeightBindingPlan& p, Context* ctx, SwapOptions<Model> o) {
          detail::SwapRequest<Source, Context, Model> request{src, detail::plan_for(handler, p), ctx, std::move(o)};
          // The caller's cancellation only raises a flag the swap checks between its steps:
          // given to co_spawn, a cancellation before the coroutine's first step would end the
          // swap without running it, and this rank would never vote. The flag and the plan's
          // copy are this operation's own: allocated with the handler's associated allocator.
          auto cancelled = std::allocate_shared<std::atomic<bool>>(asio::get_associated_allocator(handler), false);
          asio::cancellation_slot slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected())
            slot.assign([cancelled](asio::cancellation_type type) {
              if ((type & asio::cancellation_type::terminal) != asio::cancellation_type::none)
                cancelled->store(true, std::memory_order_release);
            });
          request.cancelled = cancelled;
          auto executor = asio::get_associated_executor(handler, request.source->get_executor());
          auto allocator = asio::get_associated_allocator(handler);
          asio::any_io_executor spawn_on = request.source->get_executor();
          eredu::detail::spawn_operation(
              std::move(spawn_on), detail::run_swap(Swap{state}, std::move(request)),
              asio::bind_allocator(
                  allocator, asio::bind_executor(executor, [slot, h = std::move(handler)](
                                                               std::exception_ptr e, DistributedSwapReport r) mutable {
                    if (slot.is_connected()) slot.clear();
                    std::move(h)(std::move(e), std::move(r));
                  })));
        },
        token, &state_, &source, plan, &context, std::move(options));
  }

  /// async_swap with default options. Inside a coroutine it spares the caller an options temporary in the co_await
  /// expression, which g++ 12 corrupts (docs/io.md, "Compiler caveats").
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, DistributedSwapReport)> Token>
  requires ParameterBackend<B, Source>
  auto async_swap(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                  Token&& token) {
    return async_swap(source, plan, context, SwapOptions<Model>{}, std::forward<Token>(token));
  }

  /// Takes part in a swap this rank cannot run — its source did not open, its shard plan or
  /// model could not be made — by voting no with `cause`, where the other ranks call
  /// async_swap. Without it they would wait for this rank's ballot until their vote timeout;
  /// with it they fail at once, every rank naming this rank and `cause` (its errc and
  /// message), and every rank keeps its version.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, DistributedSwapReport)`, always with an error:
  /// CollectiveError(rank_failed) naming this rank (and any other that failed);
  /// CollectiveError(collective_error) when the vote itself failed; OrchestrationError
  /// (swap_in_progress) while a swap runs on this rank (no ballot is cast then).
  ///
  /// @par Per-Operation Cancellation
  /// none: declining is one vote.
  ///
  /// Runs on `executor`. A null `cause` is voted as "declined" (errc::cancelled).
  template <asio::completion_token_for<void(std::exception_ptr, DistributedSwapReport)> Token>
  auto async_decline(std::exception_ptr cause, const asio::any_io_executor& executor, Token&& token) {
    // Without the caller's cancellation slot, as async_rollback: the ballot must be cast.
    return eredu::detail::spawn_operation(
        executor, state_.decline(std::move(cause)),
        asio::bind_cancellation_slot(asio::cancellation_slot(), std::forward<Token>(token)));
  }

  /// Switches every rank back to the version it kept for rollback, by the same vote: all ranks
  /// or none, at the same step. The version rolled back from is kept in its place, so a second
  /// rollback goes forward again.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, DistributedSwapReport)` (load, canary and verify times are 0).
  /// Errors: CollectiveError(rank_failed) when a rank keeps no previous version (released, or
  /// no swap yet) or the ranks keep different ones; CollectiveError(collective_error) when the
  /// vote failed; OrchestrationError(swap_in_progress) while a swap runs.
  ///
  /// @par Per-Operation Cancellation
  /// none: a rollback is one vote.
  ///
  /// Runs on `executor` (the swaps' executor, say).
  template <asio::completion_token_for<void(std::exception_ptr, DistributedSwapReport)> Token>
  auto async_rollback(const asio::any_io_executor& executor, Token&& token) {
    // Without the caller's cancellation slot: a rollback cancelled before its first step would
    // otherwise end without casting this rank's ballot (see async_swap).
    return eredu::detail::spawn_operation(
        executor, state_.rollback(),
        asio::bind_cancellation_slot(asio::cancellation_slot(), std::forward<Token>(token)));
  }

 private:
  using State = detail::DistributedSlotState<Model, C>;
  using Swap = detail::DistributedSwap<B, Model, C>;
  State state_;
};

}  // namespace eredu::engine
