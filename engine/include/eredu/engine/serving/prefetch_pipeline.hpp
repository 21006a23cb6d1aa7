#pragma once
/// \file
/// eredu::engine::PrefetchPipeline: stream the units (layers, experts) of a model too large
/// to keep resident, loading units i+1..i+K while the application computes with unit i.
///
/// \code
///   engine::PrefetchPipeline<cpu::Backend, Block> pipeline(*source, std::move(units),
///       [&](std::size_t) { return Block(config); }, context, {.lookahead = 2, .resident_budget = budget});
///   while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) {
///     x = unit.module().forward(x);  // unit i+1.. are being read meanwhile
///   }                                // unit i released here: its storage can take unit i+K+1
///   co_await pipeline.async_close(asio::use_awaitable);
/// \endcode
///
/// Memory bound, and why it holds whatever the model size: a unit is started only when
/// (a) fewer than K+1 units are started and not yet released — the one the consumer holds
/// plus K ahead — and (b) the bytes of every started, unreleased unit plus its own stay
/// within `resident_budget` (and (c) fewer than `concurrent_loads` units are loading, which
/// bounds bandwidth sharing, not memory). Staging is the source's lease pool, bounded
/// separately; so the pipeline never holds more than the budget plus the lease pool.
///
/// Order: units are delivered in sequence order, pass after pass. Several loads overlap,
/// but a unit that fails is reported when the consumer reaches it — units before it are
/// delivered normally, none after it — and the error stays: every later async_next
/// reports it again.
///
/// Keep-on-host: over a TransferBackend, pass engine::KeepOnHost{executor} to the constructor
/// and released units are parked in host buffers, then promoted on later passes instead of
/// being read again. Over any other backend that constructor does not exist.
///
/// Threads: all bookkeeping happens under one mutex; loads run as coroutines on the
/// source's executor (which must be single-threaded, as for CheckpointSource). A Unit may
/// be released on any thread. The state machine is in detail/prefetch_pipeline_state.hpp.

#include <asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/detail/prefetch_pipeline_state.hpp"
#include "eredu/engine/serving/prefetch_options.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace eredu::engine {

/// A bounded look-ahead loader over an ordered sequence of units (see file comment).
/// B: the backend; M: the module type of one unit, made by the factory for each load;
/// Source: the io::ByteSource the units are read from (a local checkpoint unless named).
template <ParameterBackend B, class M, io::ByteSource Source = io::CheckpointSource>
requires ParameterBackend<B, Source> && Parameterized<M, typename B::Parameter>
class PrefetchPipeline {
  using State = detail::PipelineState<B, M, Source>;
  using Slot = typename State::Slot;

 public:
  /// Makes the empty (unbound) module for unit `index`.
  using ModuleFactory = std::function<M(std::size_t index)>;

  /// A delivered unit: its bound module, held until released (destroyed or release()).
  /// Releasing returns its bytes to the budget, which lets the pipeline start the next
  /// load. An empty Unit marks the end of the sequence. Move-only.
  class Unit {
   public:
    Unit() = default;
    Unit(Unit&&) noexcept = default;
    Unit& operator=(Unit&& other) noexcept {
      if (this != &other) {
        release();
        state_ = std::move(other.state_);
        slot_ = std::move(other.slot_);
      }
      return *this;
    }
    ~Unit() { release(); }

    /// False for the end-of-sequence marker.
    explicit operator bool() const noexcept { return slot_ != nullptr; }
    /// The unit's module, every slot bound.
    M& module() const { return *slot_->module; }
    /// Position in the sequence.
    std::size_t index() const noexcept { return slot_->index; }
    /// The pass it belongs to.
    std::size_t pass() const noexcept { return slot_->pass; }
    /// The unit's name.
    const std::string& name() const { return state_->names[slot_->index]; }
    /// How long the consumer waited for it.
    std::chrono::nanoseconds stall() const noexcept { return slot_->stall; }
    /// Gives the unit back now (idempotent).
    void release() {
      if (slot_) State::release(state_, std::exchange(slot_, nullptr));
      state_.reset();
    }

   private:
    friend class PrefetchPipeline;
    Unit(std::shared_ptr<State> state, std::shared_ptr<Slot> slot) : state_(std::move(state)), slot_(std::move(slot)) {}
    std::shared_ptr<State> state_;
    std::shared_ptr<Slot> slot_;
  };

  /// Starts prefetching `units` from `source` (loads begin when the source's executor runs),
  /// reading every unit from the checkpoint on every pass. Every plan is checked against the
  /// catalog first: a bad plan, a unit larger than the budget, lookahead 0 or
  /// concurrent_loads 0 throws (RecipeError, OrchestrationError, Error(invalid_argument))
  /// before any read. `source` and `context` must outlive async_close's completion.
  PrefetchPipeline(Source& source, std::vector<PipelineUnit> units, ModuleFactory make_module,
                   typename B::MaterializationContext& context, PrefetchOptions options = {})
      : state_(State::create(source, std::move(units), std::move(make_module), context, options)) {
    State::launch(state_);
  }

  /// The same, with keep-on-host: a released unit is demoted to host buffers on
  /// `keep_on_host.executor` and promoted on later passes instead of being read again. Only
  /// for a TransferBackend; the executor must outlive async_close's completion too.
  PrefetchPipeline(Source& source, std::vector<PipelineUnit> units, ModuleFactory make_module,
                   typename B::MaterializationContext& context, PrefetchOptions options,
                   KeepOnHost<typename B::Executor> keep_on_host) requires TransferBackend<B>
      : state_(State::create(source, std::move(units), std::move(make_module), context, options)) {
    state_->parking.executor = &keep_on_host.executor;
    State::launch(state_);
  }

  PrefetchPipeline(const PrefetchPipeline&) = delete;
  PrefetchPipeline& operator=(const PrefetchPipeline&) = delete;

  /// Stops loading. Call async_close first: work still in flight here is only told to stop
  /// (it keeps its state alive), and it uses the source and context until it returns.
  ~PrefetchPipeline() { State::abandon(state_); }

  /// The next unit in sequence order, once loaded.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, Unit)` — an empty Unit after the last pass. Errors: the unit's
  /// load error (store, recipe, backend, orchestration) with its parameter qualified by the
  /// unit's name, again on every later call; errc::cancelled after cancellation or close;
  /// errc::invalid_argument when another async_next is still waiting (one at a time: the
  /// sequence has one consumer).
  ///
  /// @par Per-Operation Cancellation
  /// terminal: stops the whole pipeline, as async_close does — every load stops at its next
  /// step, every loaded unit not handed out is freed, and the operation completes with
  /// errc::cancelled once every load has returned its leases. Units the consumer holds stay
  /// valid until released.
  ///
  /// The pipeline must outlive the operation.
  template <asio::completion_token_for<void(std::exception_ptr, Unit)> Token>
  auto async_next(Token&& token) {
    return eredu::detail::spawn_operation(state_->source.get_executor(), next_unit(state_), std::forward<Token>(token));
  }

  /// Stops every load, frees every unit not handed out, and completes once every lease
  /// and every load is back. Units the consumer still holds stay valid until released.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr)`; it does not fail.
  ///
  /// @par Per-Operation Cancellation
  /// none: the stop happens at once, and the wait that follows always runs to its end.
  ///
  /// The pipeline must outlive the operation.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_close(Token&& token) {
    return eredu::detail::spawn_operation(state_->source.get_executor(), State::close(state_),
                                          std::forward<Token>(token));
  }

  /// A snapshot of the counters (any thread).
  PipelineStats stats() const { return state_->snapshot(); }

  /// Number of units in the sequence.
  std::size_t size() const noexcept { return state_->plans.size(); }

 private:
  /// async_next's coroutine: the state machine's next slot, as a Unit.
  static asio::awaitable<Unit> next_unit(std::shared_ptr<State> s) {
    std::shared_ptr<Slot> slot = co_await State::next(s);
    if (!slot) co_return Unit();
    co_return Unit(std::move(s), std::move(slot));
  }

  std::shared_ptr<State> state_;
};

}  // namespace eredu::engine
