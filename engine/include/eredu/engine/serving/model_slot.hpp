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
/// concurrent swap fails with swap_in_progress. The swap is the swap core every slot runs
/// (detail/swap_core.hpp) with this slot's policy (detail/double_buffered_swap.hpp).
///
/// Reading is wait-free: eredu::PublishedPtr (Left-Right over two shared_ptr slots) costs a
/// reader a few atomic increments and one reference-count increment — no mutex, no loop, no
/// wait on a swap. (std::atomic<std::shared_ptr> would do, but libstdc++ 12's takes a lock bit
/// on reads too and orders it too weakly; see published_ptr.hpp.)

#include <asio/async_result.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <utility>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/detail/double_buffered_swap.hpp"
#include "eredu/engine/detail/swap_core.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/serving/model_version.hpp"
#include "eredu/engine/serving/swap_options.hpp"

namespace eredu::engine {

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
  explicit ModelSlot(Factory make_model) : state_{std::move(make_model)} {}
  ModelSlot(const ModelSlot&) = delete;
  ModelSlot& operator=(const ModelSlot&) = delete;

  /// The serving version, kept alive for as long as the caller holds it; null before the
  /// first swap. Never blocks.
  std::shared_ptr<const Version> current() const noexcept { return state_.current.load(); }

  /// Generation of the serving version (0 before the first swap).
  std::uint64_t generation() const noexcept {
    auto v = current();
    return v ? v->generation : 0;
  }

  /// True while a swap is running.
  bool swapping() const noexcept { return state_.swapping.load(std::memory_order_acquire); }

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
  /// `source` is any io::ByteSource B reads from: a local checkpoint (io::CheckpointSource), or
  /// any other source, which supports the whole swap except checksums that must be verified
  /// by re-reading the file (a recipe's source tensors, or any tensor on a backend that cannot
  /// hash its weights where they land): those fail the swap with invalid_argument before any
  /// read, the serving version untouched.
  ///
  /// `source`, `context` and `options.progress` must outlive the operation; the plan is
  /// copied, and so is the canary (kept alive for the whole swap).
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  requires ParameterBackend<B, Source>
  auto async_swap(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                  SwapOptions<Model> options, Token&& token) {
    using Context = typename B::MaterializationContext;
    return asio::async_initiate<Token, void(std::exception_ptr, SwapReport)>(
        [](auto handler, State* state, Source* src, const WeightBindingPlan& p, Context* ctx, SwapOptions<Model> o) {
          detail::SwapRequest<Source, Context, Model> request{src, detail::plan_for(handler, p), ctx, std::move(o)};
          eredu::detail::spawn_operation(src->get_executor(), detail::run_swap(Swap{state}, std::move(request)),
                                         std::move(handler));
        },
        token, &state_, &source, plan, &context, std::move(options));
  }

  /// async_swap with default options.
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  requires ParameterBackend<B, Source>
  auto async_swap(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                  Token&& token) {
    return async_swap(source, plan, context, SwapOptions<Model>{}, std::forward<Token>(token));
  }

 private:
  using State = detail::DoubleBufferedState<Model>;
  using Swap = detail::DoubleBufferedSwap<B, Model>;
  State state_;
};

}  // namespace eredu::engine
