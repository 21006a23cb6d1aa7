#pragma once
/// \file
/// eredu::engine::ModelSlot: the serving version of a model, swapped for a new one without
/// ever blocking a reader or showing it a mix of versions (double-buffered hot-swap).
///
/// \code
///   engine::ModelSlot<cpu::Backend, Model> slot([&] { return Model(config); });
///   // a request: take the version once, keep it for the whole request
///   std::shared_ptr<const auto> v = slot.current();
///   reply(v->model.forward(x), v->generation);
///   // a swap, in the background, on a throttled context (an arena of 1 thread, say)
///   engine::SwapOptions<Model> options{.checksums = sums, .canary = check};
///   engine::SwapReport r = co_await slot.async_swap(*source, plan, background, std::move(options),
///                                                   asio::use_awaitable);
/// \endcode
///
/// What a swap does, in order, and why:
///  1. Builds an empty model (the factory) and loads the whole plan into it with async_load:
///     staging is the source's bounded lease pool; loads run on the context the caller
///     passes, whose executor (a TBB arena of small concurrency for the CPU backend) throttles
///     the swap so that serving keeps the cores. The new model is private until step 4.
///  2. Verifies checksums, if given (io::Checksums: from the checkpoint's metadata or a
///     sidecar) — inside the load of step 1, each tensor hashed as it lands (where the
///     backend can hash its weights; the others by re-reading the file).
///  3. Runs the caller's canary on the new model (a forward pass on a probe input, say); an
///     exception rejects the version.
///  4. Publishes with one atomic store. Readers that took the old version keep it; the old
///     version is destroyed when the last of them lets go — its tensors return to their pool,
///     where the next swap's load finds them.
/// A failure or a cancellation at any step leaves the serving version untouched and reports
/// a typed error: the load's own (truncated checkpoint, missing tensor, wrong shape, I/O
/// error...), checksum_mismatch, canary_failed, cancelled. One swap at a time: a second
/// concurrent swap fails with swap_in_progress. Steps 2 and 3 are shared with
/// InPlaceModelSlot (detail/swap_steps.hpp).
///
/// Reading is wait-free: eredu::PublishedPtr (Left-Right over two shared_ptr slots) costs a
/// reader a few atomic increments and one reference-count increment — no mutex, no loop, no
/// wait on a swap. (std::atomic<std::shared_ptr> would do, but libstdc++ 12's takes a lock bit
/// on reads too and orders it too weakly; see published_ptr.hpp.)

#include <asio/async_result.hpp>
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
#include <string>
#include <utility>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/core/published_ptr.hpp"
#include "eredu/engine/detail/load_unit.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/serving/swap_options.hpp"

namespace eredu::engine {

/// What one published version is: the bound model and where it came from.
template <class Model>
struct ModelVersion {
  Model model{};                 ///< every parameter bound
  std::uint64_t generation = 0;  ///< 1 for the first version, +1 per successful swap
  std::string origin{};          ///< what the caller said it was loaded from
};

/// The serving version of a model (see file comment). Thread-safe: current() from any
/// thread; async_swap runs on the source's executor.
template <ParameterBackend B, class Model>
requires Parameterized<Model, typename B::Parameter>
class ModelSlot {
 public:
  /// A published version.
  using Version = ModelVersion<Model>;
  /// Makes an empty model with every slot declared (dtype, shape) and nothing bound.
  using Factory = std::function<Model()>;

  /// An empty slot: current() is null until the first swap succeeds.
  explicit ModelSlot(Factory make_model) : make_model_(std::move(make_model)) {}
  ModelSlot(const ModelSlot&) = delete;
  ModelSlot& operator=(const ModelSlot&) = delete;

  /// The serving version, kept alive for as long as the caller holds it; null before the
  /// first swap. Never blocks.
  std::shared_ptr<const Version> current() const noexcept { return current_.load(); }

  /// Generation of the serving version (0 before the first swap).
  std::uint64_t generation() const noexcept {
    auto v = current();
    return v ? v->generation : 0;
  }

  /// True while a swap is running.
  bool swapping() const noexcept { return swapping_.load(std::memory_order_acquire); }

  /// Loads, verifies, checks and publishes a new version from `source` (see file comment).
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, SwapReport)`. Errors: the load's (store, recipe, backend,
  /// orchestration), checksum_mismatch, canary_failed, swap_in_progress, cancelled; after
  /// any of them the serving version is the one before the swap.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, up to the publication: the swap stops after its current step and fails with
  /// errc::cancelled. A publication is never undone.
  ///
  /// `source`, `context` and `options.progress` must outlive the operation; the plan is
  /// copied, and so is the canary (kept alive for the whole swap).
  template <asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  auto async_swap(io::CheckpointSource& source, const WeightBindingPlan& plan,
                  typename B::MaterializationContext& context, SwapOptions<Model> options, Token&& token) {
    return eredu::detail::spawn_operation(
        source.get_executor(),
        swap(source, std::make_shared<const WeightBindingPlan>(plan), context, std::move(options)),
        std::forward<Token>(token));
  }

  /// async_swap with default options.
  template <asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  auto async_swap(io::CheckpointSource& source, const WeightBindingPlan& plan,
                  typename B::MaterializationContext& context, Token&& token) {
    return async_swap(source, plan, context, SwapOptions<Model>{}, std::forward<Token>(token));
  }

 private:
  asio::awaitable<SwapReport> swap(io::CheckpointSource& source, std::shared_ptr<const WeightBindingPlan> plan,
                                   typename B::MaterializationContext& context, SwapOptions<Model> options) {
    detail::SwapClaim claim(swapping_, options.origin);
    co_await asio::this_coro::throw_if_cancelled(false);
    SwapReport report;
    const std::uint64_t serving = generation();
    asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
    const detail::SwapCancellation cancellation(cancel_state, "swap", serving);
    auto next = std::make_shared<Version>(Version{make_model_(), 0, std::move(options.origin)});

    // 1.-3. Load into the private model (checksums verified inside the load), then the canary.
    co_await detail::load_and_check<B>(next->model, source, plan, context, options, cancellation, serving, report);

    // 4. Publish. The generation is only known here: swaps are serialized, so no other
    // store can come between this read and the exchange.
    next->generation = serving + 1;
    std::shared_ptr<const Version> published = std::move(next);
    const detail::SwapClock::time_point before = detail::SwapClock::now();
    current_.publish(std::move(published));
    report.publish_pause = detail::SwapClock::now() - before;
    detail::trace_step("publish", before);
    report.generation = serving + 1;
    // Retire the old version once no reader can still be copying its pointer (readers take
    // nanoseconds, unless a reader thread was preempted inside its load): polled, so neither
    // this loop nor any reader waits. Dropped here: if no request holds it any more, its
    // storage goes back to the pool now.
    asio::steady_timer poll(co_await asio::this_coro::executor);
    for (;;) {
      if (std::optional<std::shared_ptr<const Version>> old = current_.try_retire()) break;
      poll.expires_after(std::chrono::microseconds(50));
      std::error_code ignored;  // cancellation cannot undo a publication: retire regardless
      co_await poll.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    }
    co_return report;
  }

  Factory make_model_;
  PublishedPtr<Version> current_;
  std::atomic<bool> swapping_{false};
};

}  // namespace eredu::engine
