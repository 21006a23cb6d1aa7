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
/// The cost of the vote and decision (DistributedSwapReport::commit_s) is measured in
/// bench/swap_commit.cpp.
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

#include <algorithm>
#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/collective_error.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/parallel/group_vote.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "eredu/engine/serving/swap_options.hpp"

namespace eredu::engine {

/// Settings of a DistributedModelSlot.
struct DistributedSlotOptions {
  /// Keep the version a swap replaced, for async_rollback (memory: up to three versions exist
  /// during a swap — the kept one, the serving one and the one loading).
  bool keep_previous = true;
  /// How long a rank waits for the others' ballots. Ranks vote as their loads end, so the
  /// spread of the ranks' load times must fit in it; it also bounds how long the others wait
  /// for a rank that died while loading.
  std::chrono::milliseconds vote_timeout{std::chrono::minutes(5)};
};

/// What a successful distributed swap or rollback did.
struct DistributedSwapReport : SwapReport {
  /// The vote and the decision: from casting this rank's ballot to applying the outcome.
  double commit_s = 0;
  /// The first step the new version serves, on every rank.
  std::uint64_t activation_step = 0;
  /// Ranks that voted.
  int ranks = 0;
};

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
      : make_model_(std::move(make_model)), group_(group), options_(options) {}
  DistributedModelSlot(const DistributedModelSlot&) = delete;
  DistributedModelSlot& operator=(const DistributedModelSlot&) = delete;

  /// The version the latest committed swap or rollback chose (null before the first), whatever
  /// step this rank is at: for readers outside the step protocol. A tensor-parallel forward
  /// takes its version from version_for_step instead.
  std::shared_ptr<const Version> current() const {
    std::lock_guard lock(mutex_);
    return committed_;
  }

  /// The version kept for rollback (null when none).
  std::shared_ptr<const Version> previous() const {
    std::lock_guard lock(mutex_);
    return previous_;
  }

  /// Generation of current() (0 before the first swap).
  std::uint64_t generation() const {
    std::lock_guard lock(mutex_);
    return committed_ ? committed_->generation : 0;
  }

  /// True while a swap or rollback is running on this rank.
  bool swapping() const noexcept { return swapping_.load(std::memory_order_acquire); }

  /// The version that serves `step` — the same on every rank of the group (see file comment).
  /// Blocks only while a vote is in flight and `step` has not begun on this rank yet, until
  /// the decision (at most the group's timeout).
  std::shared_ptr<const Version> version_for_step(std::uint64_t step) {
    std::vector<std::shared_ptr<const Version>> dropped;  // released after unlocking: they may free models
    std::unique_lock lock(mutex_);
    decided_.wait(lock, [&] { return !voting_ || step < fence_; });
    // Versions committed while this rank was behind each serve from their own step: several
    // may come due at once (only the last then serves this step).
    while (!schedule_.empty() && schedule_.front().first <= step) {
      dropped.push_back(std::move(replaced_));
      replaced_ = std::move(active_);
      active_ = std::move(schedule_.front().second);
      active_from_ = schedule_.front().first;
      schedule_.erase(schedule_.begin());
    }
    if (replaced_ && step > active_from_) dropped.push_back(std::move(replaced_));  // no step here needs it now
    begun_ = std::max(begun_, step + 1);
    std::shared_ptr<const Version> v = step < active_from_ && replaced_ ? replaced_ : active_;
    lock.unlock();
    return v;
  }

  /// Drops the version kept for rollback on this rank (its storage returns to its pool once
  /// no step still uses it). A later rollback then fails on every rank (this one votes no).
  void release_previous() {
    std::shared_ptr<const Version> dropped;
    std::lock_guard lock(mutex_);
    dropped = std::move(previous_);
  }

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
  /// `source`, `context` and `options.progress` must outlive the operation; the plan is copied.
  template <asio::completion_token_for<void(std::exception_ptr, DistributedSwapReport)> Token>
  auto async_swap(io::CheckpointSource& source, const WeightBindingPlan& plan,
                  typename B::MaterializationContext& context, SwapOptions<Model> options, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, DistributedSwapReport)>(
        [this](auto handler, io::CheckpointSource* src, std::shared_ptr<const WeightBindingPlan> p,
               typename B::MaterializationContext* ctx, SwapOptions<Model> o) {
          // The caller's cancellation only raises a flag the swap checks between its steps:
          // given to co_spawn, a cancellation before the coroutine's first step would end the
          // swap without running it, and this rank would never vote.
          auto cancelled = std::make_shared<std::atomic<bool>>(false);
          asio::cancellation_slot slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected())
            slot.assign([cancelled](asio::cancellation_type type) {
              if ((type & asio::cancellation_type::terminal) != asio::cancellation_type::none)
                cancelled->store(true, std::memory_order_release);
            });
          auto executor = asio::get_associated_executor(handler, src->get_executor());
          eredu::detail::spawn_operation(
              src->get_executor(), swap(*src, std::move(p), *ctx, std::move(o), std::move(cancelled)),
              asio::bind_executor(
                  executor, [slot, h = std::move(handler)](std::exception_ptr e, DistributedSwapReport r) mutable {
                    if (slot.is_connected()) slot.clear();
                    std::move(h)(std::move(e), std::move(r));
                  }));
        },
        token, &source, std::make_shared<const WeightBindingPlan>(plan), &context, std::move(options));
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
        executor, decline(std::move(cause)),
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
        executor, rollback(), asio::bind_cancellation_slot(asio::cancellation_slot(), std::forward<Token>(token)));
  }

 private:
  enum class Decision { swap, rollback };

  /// What the decision gave this rank, filled on the thread that completed the vote.
  struct Outcome {
    std::exception_ptr error{};
    std::uint64_t generation = 0;
    std::uint64_t activation_step = 0;
    std::vector<std::shared_ptr<const Version>> dropped{};  // released on the slot's executor, not the progress thread
  };

  asio::awaitable<DistributedSwapReport> swap(io::CheckpointSource& source,
                                              std::shared_ptr<const WeightBindingPlan> plan,
                                              typename B::MaterializationContext& context, SwapOptions<Model> options,
                                              std::shared_ptr<const std::atomic<bool>> cancelled) {
    detail::SwapClaim claim(swapping_, options.origin);
    DistributedSwapReport report;
    const std::uint64_t serving = generation();
    const detail::SwapCancellation cancellation(std::move(cancelled), "distributed swap", serving);
    std::shared_ptr<Version> next;
    Ballot mine;
    mine.ok = 1;
    try {
      next = std::make_shared<Version>(Version{make_model_(), 0, options.origin});
      co_await detail::load_and_check<B>(next->model, source, plan, context, options, cancellation, serving, report);
    } catch (...) {
      mine.fail(std::current_exception());
      next.reset();
    }
    co_return co_await vote(Decision::swap, std::move(next), mine, report);
  }

  asio::awaitable<DistributedSwapReport> decline(std::exception_ptr cause) {
    detail::SwapClaim claim(swapping_, "a version this rank declined");
    Ballot mine;
    mine.fail(cause ? cause : std::make_exception_ptr(Error(errc::cancelled, {}, "this rank declined the swap")));
    co_return co_await vote(Decision::swap, nullptr, mine, DistributedSwapReport{});
  }

  asio::awaitable<DistributedSwapReport> rollback() {
    detail::SwapClaim claim(swapping_, "the previous version");
    Ballot mine;
    mine.ok = 1;
    co_return co_await vote(Decision::rollback, nullptr, mine, DistributedSwapReport{});
  }

  /// Steps 2 to 4: casts `mine` (completed here with this rank's state), waits for the
  /// decision, and returns the report or throws the decision's error.
  asio::awaitable<DistributedSwapReport> vote(Decision decision, std::shared_ptr<Version> next, Ballot mine,
                                              DistributedSwapReport report) {
    auto outcome = std::make_shared<Outcome>();
    CompletionSource decided;
    const Completion applied = decided.completion();
    {
      std::lock_guard lock(mutex_);
      voting_ = true;
      fence_ = begun_;
      mine.fence = fence_;
      mine.serving = committed_ ? committed_->generation : 0;
      mine.previous = previous_ ? previous_->generation : 0;
      mine.highest = highest_;
      if (decision == Decision::rollback && !previous_) {
        mine.ok = 0;
        mine.kind = static_cast<std::int32_t>(errc::invalid_argument);
        mine.set_message(fmt::format("no previous version is kept (released, or no swap yet); it serves generation {}",
                                     mine.serving));
      }
    }
    const detail::SwapClock::time_point t = detail::SwapClock::now();
    try {
      detail::cast_vote<C>(group_, mine, options_.vote_timeout,
                           [this, decision, next = std::move(next), outcome, decided = std::move(decided)](
                               std::exception_ptr error, std::vector<Ballot> ballots) mutable {
                             apply(decision, std::move(error), ballots, std::move(next), *outcome);
                             decided.complete();
                           });
    } catch (...) {
      lift_fence();  // nothing was cast: no decision will come
      throw;
    }
    co_await applied.async_wait(asio::use_awaitable);
    report.commit_s = detail::seconds_since(t);
    detail::trace_step(decision == Decision::swap ? "vote" : "rollback vote", t);
    outcome->dropped.clear();
    if (outcome->error) std::rethrow_exception(outcome->error);
    report.generation = outcome->generation;
    report.activation_step = outcome->activation_step;
    report.ranks = C::group_size(group_);
    co_return report;
  }

  void lift_fence() {
    {
      std::lock_guard lock(mutex_);
      voting_ = false;
    }
    decided_.notify_all();
  }

  /// Step 3, on the thread that completed the vote: the same decision on every rank, from the
  /// same ballots. Bookkeeping only; the versions it lets go are handed to the coroutine.
  void apply(Decision decision, std::exception_ptr error, const std::vector<Ballot>& ballots,
             std::shared_ptr<Version> next, Outcome& out) {
    {
      std::lock_guard lock(mutex_);
      voting_ = false;
      const std::uint64_t serving = committed_ ? committed_->generation : 0;
      out.error = error ? vote_failed(decision, error, serving) : refusal(decision, ballots, serving);
      if (!out.error) {
        std::uint64_t activation = 0, highest = 0;
        for (const Ballot& b : ballots) {
          activation = std::max(activation, b.fence);
          highest = std::max(highest, b.highest);
        }
        std::shared_ptr<const Version> chosen;
        if (decision == Decision::swap) {
          next->generation = highest + 1;
          highest_ = next->generation;
          chosen = std::move(next);
          out.dropped.push_back(std::move(previous_));
          previous_ = options_.keep_previous ? committed_ : nullptr;
        } else {
          chosen = previous_;
          previous_ = committed_;
        }
        committed_ = chosen;
        // Activation steps never decrease (each rank's fence only grows). A version due at the
        // same step as this one would serve no step: replaced outright.
        if (!schedule_.empty() && schedule_.back().first == activation) {
          out.dropped.push_back(std::move(schedule_.back().second));
          schedule_.pop_back();
        }
        schedule_.emplace_back(activation, std::move(chosen));
        out.generation = committed_->generation;
        out.activation_step = activation;
      }
    }
    decided_.notify_all();
  }

  /// The CollectiveContext of this slot's votes.
  CollectiveContext context(Decision decision) const {
    CollectiveContext c;
    c.operation = decision == Decision::swap ? "swap vote" : "rollback vote";
    if constexpr (requires { group_.name(); }) c.group = group_.name();
    c.rank = C::group_rank(group_);
    c.size = C::group_size(group_);
    return c;
  }

  /// The vote itself failed (a timeout, an MPI error, an unusable group).
  std::exception_ptr vote_failed(Decision decision, const std::exception_ptr& error, std::uint64_t serving) const {
    std::string cause = "unknown error";
    std::vector<int> ranks;
    try {
      std::rethrow_exception(error);
    } catch (const CollectiveError& e) {
      cause = e.what();
      ranks = e.ranks();
    } catch (const std::exception& e) {
      cause = e.what();
    } catch (...) {}
    CollectiveContext c = context(decision);
    c.ranks = std::move(ranks);
    return std::make_exception_ptr(CollectiveError(
        errc::collective_error, std::move(c),
        fmt::format("the vote did not complete ({}); this rank keeps generation {}, and a rank that got every ballot "
                    "before this one's wait ran out may have decided without it",
                    cause, serving)));
  }

  /// Null when every ballot says commit and the ranks agree on what they serve (and keep, for
  /// a rollback); else the rank_failed error every rank reports alike.
  std::exception_ptr refusal(Decision decision, const std::vector<Ballot>& ballots, std::uint64_t serving) const {
    CollectiveContext c = context(decision);
    std::string detail;
    for (std::size_t r = 0; r < ballots.size(); ++r) {
      const Ballot& b = ballots[r];
      RankFailure f{static_cast<int>(r), errc::collective_error, {}};
      if (!b.well_formed())
        f.message = "its ballot has another layout (a different eredu build)";
      else if (!b.ok)
        f = RankFailure{static_cast<int>(r), static_cast<errc>(b.kind), std::string(b.text())};
      else
        continue;
      // A rank's message is its error's what(), which already ends with its kind.
      fmt::format_to(std::back_inserter(detail), "{}rank {} failed: {}", detail.empty() ? "" : "; ", f.rank, f.message);
      c.ranks.push_back(f.rank);
      c.failures.push_back(std::move(f));
    }
    if (c.failures.empty()) {
      // Every rank is ready: they must also agree on what they serve, or one version would be
      // switched to from different ones (a rank left behind by an earlier failed vote).
      const auto disagree = [&](auto field) {
        return std::any_of(ballots.begin(), ballots.end(),
                           [&](const Ballot& b) { return field(b) != field(ballots[0]); });
      };
      const bool serving_differs = disagree([](const Ballot& b) { return b.serving; });
      const bool kept_differs = decision == Decision::rollback && disagree([](const Ballot& b) { return b.previous; });
      if (!serving_differs && !kept_differs) return nullptr;
      detail =
          serving_differs ? "the ranks serve different generations (" : "the ranks keep different previous versions (";
      for (std::size_t r = 0; r < ballots.size(); ++r) {
        fmt::format_to(std::back_inserter(detail), "{}rank {}: {}", r ? ", " : "", r,
                       serving_differs ? ballots[r].serving : ballots[r].previous);
        c.ranks.push_back(static_cast<int>(r));
      }
      detail += ")";
    }
    fmt::format_to(std::back_inserter(detail), "; every rank keeps generation {}", serving);
    return std::make_exception_ptr(CollectiveError(errc::rank_failed, std::move(c), detail));
  }

  Factory make_model_;
  typename C::Group& group_;
  DistributedSlotOptions options_;
  std::atomic<bool> swapping_{false};

  mutable std::mutex mutex_;
  std::condition_variable decided_;             // a vote ended: fenced steps may begin
  bool voting_ = false;                         // a ballot is cast and its decision not yet applied
  std::uint64_t fence_ = 0;                     // while voting: the first step this rank may not begin
  std::uint64_t begun_ = 0;                     // one past the highest step begun here
  std::uint64_t highest_ = 0;                   // the highest generation committed here
  std::shared_ptr<const Version> committed_{};  // the latest decision's version
  std::shared_ptr<const Version> previous_{};   // kept for rollback
  // Committed versions no step here has reached yet, each with the first step it serves.
  std::vector<std::pair<std::uint64_t, std::shared_ptr<const Version>>> schedule_{};
  std::shared_ptr<const Version> active_{};  // serving steps from active_from_
  std::uint64_t active_from_ = 0;
  std::shared_ptr<const Version> replaced_{};  // served the steps before active_from_
};

}  // namespace eredu::engine
