#pragma once
/// \file
/// DistributedModelSlot's state and its policy over the swap core (swap_core.hpp). Each rank
/// loads its shard into a private model as ModelSlot does, but the commit is a vote of every
/// rank of the group (group_vote.hpp) that must hear from this rank whatever failed before it,
/// and the publication is the decision the vote applies on every rank from the same ballots:
/// the new version, its generation and the step it starts at. The state here also answers
/// version_for_step, fenced while a ballot is out (see distributed_model_slot.hpp).

#include <algorithm>
#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/collective_error.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/detail/swap_core.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/parallel/group_vote.hpp"
#include "eredu/engine/serving/model_version.hpp"
#include "eredu/engine/serving/swap_options.hpp"

namespace eredu::engine::detail {

/// What a DistributedModelSlot holds on one rank: its versions (committed, kept for rollback,
/// scheduled by step), the step fence, and the vote that changes them.
template <class Model, VotingBackend C>
class DistributedSlotState {
 public:
  /// A committed version.
  using Version = ModelVersion<Model>;
  /// Makes an empty model with every slot of this rank's shard declared and nothing bound.
  using Factory = std::function<Model()>;

  /// No version yet; votes go over `group`.
  DistributedSlotState(Factory make, typename C::Group& group, DistributedSlotOptions options)
      : make_model(std::move(make)), group_(group), options_(options) {}
  DistributedSlotState(const DistributedSlotState&) = delete;
  DistributedSlotState& operator=(const DistributedSlotState&) = delete;

  Factory make_model;                 ///< makes this rank's empty shard model
  std::atomic<bool> swapping{false};  ///< a swap, decline or rollback holds the slot (SwapClaim)

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

  /// What a vote decides: to switch to a new version, or back to the one kept.
  enum class Decision { swap, rollback };

  /// What the decision gave this rank, filled on the thread that completed the vote.
  struct Outcome {
    std::exception_ptr error{};
    std::uint64_t generation = 0;
    std::uint64_t activation_step = 0;
    std::vector<std::shared_ptr<const Version>> dropped{};  // released on the slot's executor, not the progress thread
  };

  /// A vote of no with `cause` (null: "declined") for a swap this rank cannot run.
  asio::awaitable<DistributedSwapReport> decline(std::exception_ptr cause) {
    SwapClaim claim(swapping, "a version this rank declined");
    Ballot mine;
    mine.fail(cause ? cause : std::make_exception_ptr(Error(errc::cancelled, {}, "this rank declined the swap")));
    co_return co_await decide(Decision::swap, nullptr, mine);
  }

  /// A vote to switch every rank back to the version it kept.
  asio::awaitable<DistributedSwapReport> rollback() {
    SwapClaim claim(swapping, "the previous version");
    Ballot mine;
    mine.ok = 1;
    co_return co_await decide(Decision::rollback, nullptr, mine);
  }

  /// A vote that loads nothing (a decline, a rollback): commit, publish and retire in one.
  asio::awaitable<DistributedSwapReport> decide(Decision decision, std::shared_ptr<Version> next, Ballot mine) {
    DistributedSwapReport report;
    std::shared_ptr<Outcome> outcome = co_await vote(decision, std::move(next), mine, report);
    outcome->dropped.clear();
    finish(*outcome, report);
    co_return report;
  }

  /// The commit: casts `mine` (completed here with this rank's state), waits for the decision
  /// (applied by then), and gives back its outcome; times the vote in `report`.
  asio::awaitable<std::shared_ptr<Outcome>> vote(Decision decision, std::shared_ptr<Version> next, Ballot mine,
                                                 DistributedSwapReport& report) {
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
    const SwapClock::time_point t = SwapClock::now();
    try {
      cast_vote<C>(group_, mine, options_.vote_timeout,
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
    report.commit_s = seconds_since(t);
    trace_step(decision == Decision::swap ? "vote" : "rollback vote", t);
    co_return outcome;
  }

  /// What the decision was for this rank: the report of a committed swap or rollback (`report`
  /// completed), or the decision's error, thrown. The decision itself was applied when the vote
  /// completed (apply): that is the publication.
  void finish(const Outcome& outcome, DistributedSwapReport& report) const {
    if (outcome.error) std::rethrow_exception(outcome.error);
    report.generation = outcome.generation;
    report.activation_step = outcome.activation_step;
    report.ranks = C::group_size(group_);
  }

  /// Lets steps begin again when no decision will come (nothing was cast).
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

 private:
  typename C::Group& group_;
  DistributedSlotOptions options_;

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

/// DistributedModelSlot's swap policy (see file comment and run_swap's requirements).
template <ParameterBackend B, class Model, VotingBackend C>
struct DistributedSwap : NewModelSteps<B, Model> {
  using typename NewModelSteps<B, Model>::Version;
  using typename NewModelSteps<B, Model>::Staged;
  using State = DistributedSlotState<Model, C>;                ///< the slot's
  using Report = DistributedSwapReport;                        ///< what a swap reports
  using Committed = std::shared_ptr<typename State::Outcome>;  ///< the decision, as this rank applied it
  static constexpr const char* what = "distributed swap";      ///< the swap's name in messages
  static constexpr bool check_after_canary = true;             ///< a cancellation stops the swap after its canary

  /// The policy of a swap of the slot whose state is `s`.
  explicit DistributedSwap(State* s) : NewModelSteps<B, Model>{s->make_model}, state(s) {}

  State* state;  ///< the slot's (outlives the swap)

  /// The slot's claim flag.
  std::atomic<bool>& swapping() const noexcept { return state->swapping; }
  /// The committed version's generation.
  std::uint64_t serving_generation() const { return state->generation(); }
  /// The vote: this rank's ballot says whether its steps succeeded (a failure is voted, not
  /// thrown: the other ranks would wait for it until their timeout).
  asio::awaitable<Committed> commit(std::optional<Staged> staged, std::exception_ptr failure, Report& report) const {
    Ballot mine;
    mine.ok = 1;
    if (failure) mine.fail(failure);
    return state->vote(State::Decision::swap, staged ? std::move(*staged) : nullptr, mine, report);
  }
  /// The decision was applied when the vote completed: reports it, or throws its error.
  asio::awaitable<void> publish(Committed& outcome, std::uint64_t, const SwapCancellation&, Report& report) const {
    state->finish(*outcome, report);
    co_return;
  }
  /// Releases the versions the decision let go, here on the slot's executor rather than on the
  /// thread that completed the vote.
  asio::awaitable<void> retire(Committed& outcome) const {
    outcome->dropped.clear();
    co_return;
  }
};

}  // namespace eredu::engine::detail
