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
///   engine::SwapReport r = co_await slot.async_swap(*source, plan, background, asio::use_awaitable,
///                                                   {.checksums = sums, .canary = check});
/// \endcode
///
/// What a swap does, in order, and why:
///  1. Builds an empty model (the factory) and loads the whole plan into it with async_load:
///     staging is the source's bounded lease pool; loads run on the context the caller
///     passes, whose executor (a TBB arena of small concurrency for the CPU backend) throttles
///     the swap so that serving keeps the cores. The new model is private until step 4.
///  2. Verifies checksums, if given (io::Checksums: from the checkpoint's metadata or a
///     sidecar), by re-reading the listed tensors.
///  3. Runs the caller's canary on the new model (a forward pass on a probe input, say); an
///     exception rejects the version.
///  4. Publishes with one atomic store. Readers that took the old version keep it; the old
///     version is destroyed when the last of them lets go — its tensors return to their pool,
///     where the next swap's load finds them.
/// A failure or a cancellation at any step leaves the serving version untouched and reports
/// a typed error: the load's own (truncated checkpoint, missing tensor, wrong shape, I/O
/// error...), checksum_mismatch, canary_failed, cancelled. One swap at a time: a second
/// concurrent swap fails with swap_in_progress.
///
/// Reading is wait-free: eredu::PublishedPtr (Left-Right over two shared_ptr slots) costs a
/// reader a few atomic increments and one reference-count increment — no mutex, no loop, no
/// wait on a swap. (std::atomic<std::shared_ptr> would do, but libstdc++ 12's takes a lock bit
/// on reads too and orders it too weakly; see published_ptr.hpp.)

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
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

#include <fmt/format.h>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/published_ptr.hpp"
#include "eredu/engine/engine_error.hpp"
#include "eredu/engine/load.hpp"
#include "eredu/io/checksums.hpp"

namespace eredu::engine {

/// What one published version is: the bound model and where it came from.
template <class Model>
struct ModelVersion {
  Model model;                   ///< every parameter bound
  std::uint64_t generation = 0;  ///< 1 for the first version, +1 per successful swap
  std::string origin;            ///< what the caller said it was loaded from
};

/// Per-swap options.
template <class Model>
struct SwapOptions {
  /// Label recorded in the version (a path, a revision).
  std::string origin;
  /// Digests to verify before publishing (empty: none).
  io::Checksums checksums;
  /// Checks the new model before it is published; throwing rejects it (canary_failed).
  std::function<asio::awaitable<void>(const Model&)> canary;
  /// Load progress counters, if set; must outlive the swap.
  MaterializeProgress* progress = nullptr;
};

/// What a successful swap did and how long each step took.
struct SwapReport {
  std::uint64_t generation = 0;      ///< the version now serving
  std::uint64_t bytes = 0;           ///< bytes the new version's weights occupy
  std::uint64_t verified_bytes = 0;  ///< bytes re-read for checksums
  double load_s = 0;                 ///< step 1
  double verify_s = 0;               ///< step 2
  double canary_s = 0;               ///< step 3
  /// ModelSlot: the publication itself (readers never wait); InPlaceModelSlot: the
  /// drain of requests in flight plus the copy, during which new reads wait.
  std::chrono::nanoseconds publish_pause{0};
  /// InPlaceModelSlot only: the part of publish_pause spent waiting for requests in flight.
  std::chrono::nanoseconds readers_drained{0};
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
  /// Completion signature: void(std::exception_ptr, SwapReport). `source` and `context`
  /// must outlive the operation; the plan is copied. An Asio cancellation slot bound to
  /// the token cancels it (errc::cancelled) up to the publication.
  template <class Token>
  auto async_swap(io::CheckpointSource& source, const WeightBindingPlan& plan,
                  typename B::MaterializationContext& context, Token&& token, SwapOptions<Model> options = {}) {
    return eredu::detail::spawn_operation(
        source.get_executor(),
        swap(source, std::make_shared<const WeightBindingPlan>(plan), context, std::move(options)),
        std::forward<Token>(token));
  }

 private:
  using Clock = std::chrono::steady_clock;

  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  asio::awaitable<SwapReport> swap(io::CheckpointSource& source, std::shared_ptr<const WeightBindingPlan> plan,
                                   typename B::MaterializationContext& context, SwapOptions<Model> options) {
    if (swapping_.exchange(true, std::memory_order_acq_rel))
      throw OrchestrationError(errc::swap_in_progress, {},
                               fmt::format("cannot swap to {}: another swap of this slot is still running",
                                           options.origin.empty() ? std::string("a new version") : options.origin));
    struct Done {
      std::atomic<bool>& flag;
      ~Done() { flag.store(false, std::memory_order_release); }
    } done{swapping_};

    co_await asio::this_coro::throw_if_cancelled(false);
    asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
    auto check_cancelled = [&](const char* step) {
      if (cancel_state.cancelled() != asio::cancellation_type::none)
        throw Error(errc::cancelled, {},
                    fmt::format("the swap was cancelled {}; version {} keeps serving", step, generation()));
    };

    SwapReport report;
    const std::uint64_t serving = generation();
    auto next = std::make_shared<Version>(Version{make_model_(), 0, std::move(options.origin)});

    // 1. Load into the private model.
    Clock::time_point t = Clock::now();
    MaterializeOptions materialize{.progress = options.progress};
    co_await detail::load_unit<B>(next->model, source, plan, context, materialize);
    report.load_s = seconds_since(t);
    for (const InferredWeight& w : plan->check(source.catalog())) report.bytes += w.bytes;
    check_cancelled("after the load");

    // 2. Checksums.
    if (!options.checksums.empty()) {
      t = Clock::now();
      report.verified_bytes = co_await io::async_verify_checksums(source, options.checksums, asio::use_awaitable);
      report.verify_s = seconds_since(t);
      check_cancelled("after checksum verification");
    }

    // 3. Canary.
    if (options.canary) {
      t = Clock::now();
      std::exception_ptr rejected;
      try {
        co_await options.canary(std::as_const(next->model));
      } catch (const std::exception& e) {
        rejected = std::make_exception_ptr(OrchestrationError(
            errc::canary_failed, {},
            fmt::format("the canary rejected the new version ({}); version {} keeps serving", e.what(), serving)));
      } catch (...) {
        rejected = std::make_exception_ptr(
            OrchestrationError(errc::canary_failed, {},
                               fmt::format("the canary rejected the new version; version {} keeps serving", serving)));
      }
      if (rejected) std::rethrow_exception(rejected);
      report.canary_s = seconds_since(t);
      check_cancelled("after the canary");
    }

    // 4. Publish. The generation is only known here: swaps are serialized, so no other
    // store can come between this read and the exchange.
    next->generation = serving + 1;
    std::shared_ptr<const Version> published = std::move(next);
    const Clock::time_point before = Clock::now();
    current_.publish(std::move(published));
    report.publish_pause = Clock::now() - before;
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
