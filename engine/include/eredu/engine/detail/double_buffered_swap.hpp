#pragma once
/// \file
/// ModelSlot's state and its policy over the swap core (swap_core.hpp): the new version loads
/// into a private model, commits at once, is published with one atomic store, and the version
/// it replaced is retired once no reader can still be copying its pointer.

#include <asio/awaitable.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include "eredu/core/published_ptr.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/detail/swap_core.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/serving/model_version.hpp"
#include "eredu/engine/serving/swap_options.hpp"

namespace eredu::engine::detail {

/// What a ModelSlot holds: its factory, the published version and its claim flag.
template <class Model>
struct DoubleBufferedState {
  std::function<Model()> make_model;            ///< makes an empty model with every slot declared
  PublishedPtr<ModelVersion<Model>> current{};  ///< the serving version (wait-free reads)
  std::atomic<bool> swapping{false};            ///< a swap holds the slot (SwapClaim)
};

/// ModelSlot's swap policy (see file comment and run_swap's requirements).
template <ParameterBackend B, class Model>
struct DoubleBufferedSwap : NewModelSteps<B, Model> {
  using typename NewModelSteps<B, Model>::Version;
  using typename NewModelSteps<B, Model>::Staged;
  using Report = SwapReport;                        ///< what a swap reports
  using Committed = Staged;                         ///< the new version, once committed
  static constexpr const char* what = "swap";       ///< the swap's name in messages
  static constexpr bool check_after_canary = true;  ///< a cancellation stops the swap after its canary

  /// The policy of a swap of the slot whose state is `s`.
  explicit DoubleBufferedSwap(DoubleBufferedState<Model>* s) : NewModelSteps<B, Model>{s->make_model}, state(s) {}

  DoubleBufferedState<Model>* state;  ///< the slot's (outlives the swap)

  /// The slot's claim flag.
  std::atomic<bool>& swapping() const noexcept { return state->swapping; }
  /// The serving version's generation (0 before the first swap).
  std::uint64_t serving_generation() const noexcept {
    std::shared_ptr<const Version> v = state->current.load();
    return v ? v->generation : 0;
  }
  /// At once.
  asio::awaitable<Committed> commit(std::optional<Staged> staged, std::exception_ptr failure, Report&) const {
    return commit_locally(std::move(staged), std::move(failure));
  }
  /// One atomic store. The generation is only known here: swaps are serialized, so no other
  /// store can come between the read of `serving` and the exchange.
  asio::awaitable<void> publish(Committed& next, std::uint64_t serving, const SwapCancellation&, Report& report) const {
    next->generation = serving + 1;
    std::shared_ptr<const Version> published = std::move(next);
    const SwapClock::time_point before = SwapClock::now();
    state->current.publish(std::move(published));
    report.publish_pause = SwapClock::now() - before;
    trace_step("publish", before);
    report.generation = serving + 1;
    co_return;
  }
  /// Retires the old version once no reader can still be copying its pointer (readers take
  /// nanoseconds, unless a reader thread was preempted inside its load): polled, so neither
  /// this loop nor any reader waits. Dropped here: if no request holds it any more, its
  /// storage goes back to the pool now.
  asio::awaitable<void> retire(Committed&) const {
    asio::steady_timer poll(co_await asio::this_coro::executor);
    for (;;) {
      if (std::optional<std::shared_ptr<const Version>> old = state->current.try_retire()) break;
      poll.expires_after(std::chrono::microseconds(50));
      std::error_code ignored;  // cancellation cannot undo a publication: retire regardless
      co_await poll.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    }
  }
};

}  // namespace eredu::engine::detail
