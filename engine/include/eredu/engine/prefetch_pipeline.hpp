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
/// bounds bandwidth sharing, not memory). Staging is the source's lease pool, bounded separately; so
/// the pipeline never holds more than the budget plus the lease pool.
///
/// Order: units are delivered in sequence order, pass after pass. Several loads overlap,
/// but a unit that fails is reported when the consumer reaches it — units before it are
/// delivered normally, none after it — and the error stays: every later async_next
/// reports it again.
///
/// Threads: all bookkeeping happens under one mutex; loads run as coroutines on the
/// source's executor (which must be single-threaded, as for CheckpointSource). A Unit may
/// be released on any thread.
///
/// Cancellation: emitting a cancellation slot bound to async_next, or async_close, stops
/// every load at its next step, frees every loaded unit not handed out, waits until every
/// load has returned its leases, then completes (async_next: with eredu::errc::cancelled).

#include <algorithm>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/bind.hpp"
#include "eredu/engine/materialize.hpp"
#include "eredu/engine/parameter_error.hpp"
#include "eredu/engine/transfer_backend.hpp"
#include "eredu/engine/weight_binding_plan.hpp"

namespace eredu::engine {

/// One unit of a pipeline: its name (for reports and errors) and the plan that loads it.
struct PipelineUnit {
  std::string name;        ///< e.g. "layers.3"; qualifies the parameters named in errors
  WeightBindingPlan plan;  ///< the unit's bindings, named as its module's slots
};

/// How far ahead a PrefetchPipeline loads, and within what memory.
struct PrefetchOptions {
  /// Units loaded ahead of the one the consumer holds (K). At least 1.
  std::size_t lookahead = 2;
  /// Bytes of units started and not yet released, at most (0: (K+1) × the largest unit).
  std::uint64_t resident_budget = 0;
  /// Passes over the sequence (token-by-token decoding streams every layer each step);
  /// 0 streams until async_close.
  std::size_t passes = 1;
  /// Keep a released unit's weights in backend host buffers (TransferBackend::demote) and
  /// promote them on the next pass instead of re-reading the checkpoint. Needs a
  /// TransferBackend and a park executor; host memory then holds every unit once.
  bool keep_on_host = false;
  /// Units being read at once (at least 1). One, the default, streams units in order, so
  /// the unit the consumer needs next gets all the read bandwidth and a disk sees one
  /// sequential stream; more can help when one unit cannot keep the reader busy.
  std::size_t concurrent_loads = 1;
  /// Per-unit timings kept in PipelineStats::units (the oldest are dropped beyond this).
  std::size_t timing_history = 4096;
};

/// What happened to one delivered unit.
struct UnitTiming {
  std::size_t index = 0;    ///< position in the sequence
  std::size_t pass = 0;     ///< pass it belongs to
  std::uint64_t bytes = 0;  ///< bytes its weights occupy
  double load_s = 0;        ///< from the start of its load to ready
  double stall_s = 0;       ///< how long the consumer waited for it in async_next
  bool from_host = false;   ///< promoted from a parked host copy, not read
};

/// Counters of a pipeline so far (see PrefetchPipeline::stats).
struct PipelineStats {
  std::uint64_t budget = 0;               ///< the resident budget in force
  std::uint64_t resident_bytes = 0;       ///< bytes of started, unreleased units now
  std::uint64_t resident_high_water = 0;  ///< the most resident_bytes ever reached
  std::uint64_t parked_bytes = 0;         ///< bytes held in host buffers (keep_on_host)
  std::size_t delivered = 0;              ///< units handed to the consumer
  double stall_s = 0;                     ///< total consumer wait
  double load_s = 0;                      ///< total of per-unit load times (they overlap)
  /// The most recent delivered units, in delivery order (at most
  /// PrefetchOptions::timing_history of them, so an endless stream stays bounded).
  std::deque<UnitTiming> units;
};

/// A bounded look-ahead loader over an ordered sequence of units (see file comment).
/// B: the backend; M: the module type of one unit, made by the factory for each load.
template <ParameterBackend B, class M>
requires Parameterized<M, typename B::Parameter>
class PrefetchPipeline {
  struct State;
  struct Slot;

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
    friend struct State;
    Unit(std::shared_ptr<State> state, std::shared_ptr<Slot> slot) : state_(std::move(state)), slot_(std::move(slot)) {}
    std::shared_ptr<State> state_;
    std::shared_ptr<Slot> slot_;
  };

  /// Starts prefetching `units` from `source` (loads begin when the source's executor runs).
  /// Every plan is checked against the catalog first: a bad plan, a unit larger than the
  /// budget, or lookahead 0 throws (RecipeError, OrchestrationError, Error(invalid_argument))
  /// before any read. `source` and `context` must outlive async_close's completion; with
  /// keep_on_host, so must `park_executor`.
  PrefetchPipeline(io::CheckpointSource& source, std::vector<PipelineUnit> units, ModuleFactory make_module,
                   typename B::MaterializationContext& context, PrefetchOptions options = {},
                   typename B::Executor* park_executor = nullptr)
      : state_(std::make_shared<State>(source, context, options, std::move(make_module), park_executor)) {
    State& s = *state_;
    if (options.lookahead == 0)
      throw Error(errc::invalid_argument, {}, "a prefetch pipeline needs a look-ahead of at least 1 unit");
    if (options.concurrent_loads == 0)
      throw Error(errc::invalid_argument, {}, "a prefetch pipeline needs at least 1 concurrent load");
    if (options.keep_on_host && park_executor == nullptr)
      throw Error(errc::invalid_argument, {}, "keep_on_host needs an executor to demote and promote units on");
    if (options.keep_on_host && !TransferBackend<B>)
      throw Error(errc::invalid_argument, {}, "keep_on_host needs a backend with host transfer (TransferBackend)");
    std::uint64_t largest = 0;
    for (PipelineUnit& unit : units) {
      std::uint64_t bytes = 0;
      try {
        for (const InferredWeight& w : unit.plan.check(source.catalog())) bytes += w.bytes;
      } catch (...) {
        std::rethrow_exception(qualify_parameter(std::current_exception(), unit.name));
      }
      largest = std::max(largest, bytes);
      s.names.push_back(std::move(unit.name));
      s.bytes.push_back(bytes);
      s.plans.push_back(std::make_shared<const WeightBindingPlan>(std::move(unit.plan)));
    }
    s.parked.resize(s.plans.size());
    s.budget = options.resident_budget ? options.resident_budget : largest * (options.lookahead + 1);
    s.stats.budget = s.budget;
    for (std::size_t i = 0; i < s.bytes.size(); ++i)
      if (s.bytes[i] > s.budget)
        throw Error(errc::invalid_argument, {},
                    fmt::format("unit '{}' needs {} bytes, more than the whole resident budget of {} bytes", s.names[i],
                                s.bytes[i], s.budget));
    asio::co_spawn(source.get_executor(), State::produce(state_), asio::detached);
  }

  PrefetchPipeline(const PrefetchPipeline&) = delete;
  PrefetchPipeline& operator=(const PrefetchPipeline&) = delete;

  /// Stops loading. Call async_close first: work still in flight here is only told to stop
  /// (it keeps its state alive), and it uses the source and context until it returns.
  ~PrefetchPipeline() {
    std::shared_ptr<State> s = state_;
    {
      // Closed, or run to its end with nothing loading: nothing to stop, and nothing is
      // posted (so a pipeline may outlive its event loop once it is done).
      std::lock_guard lock(s->mutex);
      const bool loading =
          std::any_of(s->loading.begin(), s->loading.end(), [](const std::shared_ptr<Slot>& l) { return l->loading; });
      if (s->stopping || (s->producer_done && !loading)) return;
    }
    asio::post(s->source.get_executor(), [s] { State::stop(s); });
  }

  /// The next unit in sequence order, once loaded. Completion signature:
  /// void(std::exception_ptr, Unit) — an empty Unit after the last pass. Errors: the unit's
  /// load error (store, recipe, backend, orchestration) with its parameter qualified by the
  /// unit's name, again on every later call; errc::cancelled after cancellation or close;
  /// errc::invalid_argument when another async_next is still waiting (one at a time: the
  /// sequence has one consumer).
  template <class Token>
  auto async_next(Token&& token) {
    return eredu::detail::spawn_operation(state_->source.get_executor(), State::next(state_),
                                          std::forward<Token>(token));
  }

  /// Stops every load, frees every unit not handed out, and completes once every lease
  /// and every load is back. Completion signature: void(std::exception_ptr). Units the
  /// consumer still holds stay valid until released.
  template <class Token>
  auto async_close(Token&& token) {
    return eredu::detail::spawn_operation(state_->source.get_executor(), State::close(state_),
                                          std::forward<Token>(token));
  }

  /// A snapshot of the counters (any thread).
  PipelineStats stats() const {
    std::lock_guard lock(state_->mutex);
    return state_->stats;
  }

  /// Number of units in the sequence.
  std::size_t size() const noexcept { return state_->plans.size(); }

 private:
  using Clock = std::chrono::steady_clock;

  /// One started load of one unit in one pass.
  struct Slot {
    std::size_t index = 0;
    std::size_t pass = 0;
    CompletionSource done_source;  // completed when the load has finished, either way
    Completion done = done_source.completion();
    asio::cancellation_signal cancel;  // stops the load (emitted on the executor only)
    bool loading = true;
    bool released = false;
    std::unique_ptr<M> module;  // the bound module, once loaded
    std::exception_ptr error;
    // keep_on_host: the owners' weights, shared with the module, to demote on release.
    std::vector<std::pair<ParameterId, typename B::MaterializedWeight>> owners;
    bool from_host = false;
    Clock::time_point started = Clock::now();
    Clock::time_point finished;
    std::chrono::nanoseconds stall{0};
  };

  /// Host copies of one unit's owners (keep_on_host).
  struct Parked {
    std::vector<std::pair<ParameterId, typename B::HostBuffer>> buffers;
    Completion ready;  // the demotion copies
  };

  /// Everything the pipeline, its loads and its units share.
  struct State {
    State(io::CheckpointSource& src, typename B::MaterializationContext& ctx, PrefetchOptions opts, ModuleFactory make,
          typename B::Executor* park)
        : source(src), context(ctx), options(opts), make_module(std::move(make)), park_executor(park) {}

    io::CheckpointSource& source;
    typename B::MaterializationContext& context;
    const PrefetchOptions options;
    const ModuleFactory make_module;
    typename B::Executor* const park_executor;
    std::vector<std::string> names;
    std::vector<std::uint64_t> bytes;
    std::vector<std::shared_ptr<const WeightBindingPlan>> plans;
    std::uint64_t budget = 0;

    mutable std::mutex mutex;
    std::deque<std::shared_ptr<Slot>> queue;            // started, not yet handed out, in order
    std::vector<std::shared_ptr<Slot>> loading;         // loads not finished (pruned as they finish)
    std::vector<std::shared_ptr<const Parked>> parked;  // per unit (keep_on_host)
    std::size_t outstanding = 0;                        // started and not released
    std::size_t in_flight = 0;                          // started and still loading
    bool stopping = false;
    bool failed = false;  // a load failed: start nothing more
    bool producer_done = false;
    bool consumer_busy = false;   // an async_next is running (one at a time)
    std::exception_ptr terminal;  // delivered to the consumer; reported again after
    std::optional<CompletionSource> producer_wake, consumer_wake;
    CompletionSource producer_exit_source;
    Completion producer_exit = producer_exit_source.completion();
    PipelineStats stats;

    /// Takes a waiting producer's or consumer's wake-up source out (call with the mutex
    /// held); complete_all() completes it once the caller has unlocked.
    static void wake(std::optional<CompletionSource>& waiter, std::vector<CompletionSource>& out) {
      if (waiter) {
        out.push_back(std::move(*waiter));
        waiter.reset();
      }
    }
    /// Completes the wake-up sources wake() took out (call without the mutex).
    static void complete_all(std::vector<CompletionSource>& sources) {
      for (auto& s : sources) s.complete();
    }

    /// Starts units in order while the look-ahead and the budget allow.
    static asio::awaitable<void> produce(std::shared_ptr<State> s) {
      const std::size_t n = s->plans.size();
      bool running = n > 0;
      for (std::size_t pass = 0; running && (s->options.passes == 0 || pass < s->options.passes); ++pass) {
        for (std::size_t i = 0; running && i < n; ++i) {
          std::shared_ptr<Slot> slot;
          while (running) {
            Completion wait;
            std::vector<CompletionSource> wakes;
            {
              std::lock_guard lock(s->mutex);
              if (s->stopping || s->failed) {
                running = false;
                break;
              }
              if (s->outstanding < s->options.lookahead + 1 && s->in_flight < s->options.concurrent_loads &&
                  s->stats.resident_bytes + s->bytes[i] <= s->budget) {
                ++s->in_flight;
                slot = std::make_shared<Slot>();
                slot->index = i;
                slot->pass = pass;
                ++s->outstanding;
                s->stats.resident_bytes += s->bytes[i];
                s->stats.resident_high_water = std::max(s->stats.resident_high_water, s->stats.resident_bytes);
                s->queue.push_back(slot);
                std::erase_if(s->loading, [](const std::shared_ptr<Slot>& l) { return !l->loading; });
                s->loading.push_back(slot);
                wake(s->consumer_wake, wakes);
              } else {
                s->producer_wake.emplace();
                wait = s->producer_wake->completion();
              }
            }
            complete_all(wakes);
            if (slot) break;
            co_await settle(wait);
          }
          if (!slot) break;
          asio::co_spawn(s->source.get_executor(), load(s, slot),
                         asio::bind_cancellation_slot(slot->cancel.slot(), asio::detached));
        }
      }
      std::vector<CompletionSource> wakes;
      {
        std::lock_guard lock(s->mutex);
        s->producer_done = true;
        wake(s->consumer_wake, wakes);
      }
      complete_all(wakes);
      s->producer_exit_source.complete();
    }

    /// Loads one unit (read and materialize, or promote its parked copy) and binds it.
    static asio::awaitable<void> load(std::shared_ptr<State> s, std::shared_ptr<Slot> slot) {
      std::exception_ptr error;
      std::unique_ptr<M> module;
      std::vector<std::pair<ParameterId, typename B::MaterializedWeight>> owners;
      bool from_host = false;
      co_await asio::this_coro::throw_if_cancelled(false);
      try {
        module = std::make_unique<M>(s->make_module(slot->index));
        std::shared_ptr<const Parked> parked;
        {
          std::lock_guard lock(s->mutex);
          parked = s->parked[slot->index];
        }
        MaterializedUnit<B> unit;
        if (parked) {
          from_host = true;
          unit = co_await promote(*s, *parked, *s->plans[slot->index]);
        } else {
          unit = co_await detail::materialize_unit<B>(s->source, s->plans[slot->index], s->context, {});
        }
        if (s->options.keep_on_host && !parked)
          for (const WeightBinding* owner : s->plans[slot->index]->owners())
            owners.emplace_back(owner->id(), B::share_materialized_weight(*unit.find(owner->id())));
        bind_materialized_unit<B>(*module, std::move(unit));
      } catch (...) {
        error = qualify_parameter(std::current_exception(), s->names[slot->index]);
        module.reset();
        owners.clear();
      }

      bool keep = false;
      std::vector<std::shared_ptr<Slot>> to_cancel;
      std::vector<CompletionSource> wakes;
      {
        std::lock_guard lock(s->mutex);
        slot->loading = false;
        slot->finished = Clock::now();
        --s->in_flight;
        wake(s->producer_wake, wakes);
        slot->from_host = from_host;
        if (error) {
          slot->error = error;
          if (!s->stopping && !is_cancellation(error)) {
            // Nothing after a failed unit will be delivered: stop what was started after it.
            s->failed = true;
            for (auto& other : s->loading)
              if (other->loading &&
                  (other->pass > slot->pass || (other->pass == slot->pass && other->index > slot->index)))
                to_cancel.push_back(other);
            wake(s->producer_wake, wakes);
          }
        } else if (!s->stopping) {
          slot->module = std::move(module);
          slot->owners = std::move(owners);
          keep = true;
        }
        if (!keep) {
          // Failed, cancelled or loaded after a stop: it will never be handed out, and its
          // reservation goes back now.
          slot->released = true;
          --s->outstanding;
          s->stats.resident_bytes -= s->bytes[slot->index];
          wake(s->producer_wake, wakes);
        }
      }
      for (auto& other : to_cancel) other->cancel.emit(asio::cancellation_type::terminal);
      module.reset();
      owners.clear();
      complete_all(wakes);
      slot->done_source.complete();
    }

    /// Brings a parked unit back from its host buffers.
    static asio::awaitable<MaterializedUnit<B>> promote(State& s, const Parked& parked, const WeightBindingPlan& plan) {
      if constexpr (TransferBackend<B>) {
        co_await parked.ready.async_wait(asio::use_awaitable);
        typename MaterializedUnit<B>::Weights weights;
        std::vector<Completion> copies;
        for (const auto& [id, host] : parked.buffers) {
          auto [weight, copied] = B::promote(*s.park_executor, host);
          weights.emplace(id, std::move(weight));
          copies.push_back(std::move(copied));
        }
        co_await when_all(copies).async_wait(asio::use_awaitable);
        for (auto [alias, owner] : plan.aliases())
          weights.emplace(alias->id(), B::share_materialized_weight(weights.at(owner->id())));
        co_return MaterializedUnit<B>(std::move(weights));
      } else {
        throw Error(errc::invalid_argument, {}, "keep_on_host needs a TransferBackend");
      }
    }

    /// Gives a delivered (or abandoned) unit back; any thread.
    static void release(const std::shared_ptr<State>& s, std::shared_ptr<Slot> slot) {
      std::unique_ptr<M> module;
      std::vector<std::pair<ParameterId, typename B::MaterializedWeight>> owners;
      bool park = false;
      {
        std::lock_guard lock(s->mutex);
        if (slot->released) return;
        slot->released = true;
        module = std::move(slot->module);
        owners = std::move(slot->owners);
        --s->outstanding;
        park = !owners.empty() && !s->parked[slot->index];
      }
      std::uint64_t bytes = s->bytes[slot->index];
      if constexpr (TransferBackend<B>) {
        if (park) {
          // Demote while the module goes: the copies retain the device storage until done,
          // so the bytes stay counted as resident until then.
          auto parked = std::make_shared<Parked>();
          std::vector<Completion> copies;
          for (auto& [id, weight] : owners) {
            auto [host, copied] = B::demote(*s->park_executor, weight);
            parked->buffers.emplace_back(id, std::move(host));
            copies.push_back(std::move(copied));
          }
          parked->ready = when_all(copies);
          module.reset();
          owners.clear();
          {
            std::lock_guard lock(s->mutex);
            s->stats.parked_bytes += bytes;
            s->parked[slot->index] = parked;
          }
          parked->ready.on_complete([s, bytes](std::exception_ptr) { State::give_back(s, bytes); });
          return;
        }
      }
      module.reset();
      owners.clear();
      give_back(s, bytes);
    }

    /// Returns `bytes` of resident budget and wakes the producer.
    static void give_back(const std::shared_ptr<State>& s, std::uint64_t bytes) {
      std::vector<CompletionSource> wakes;
      {
        std::lock_guard lock(s->mutex);
        s->stats.resident_bytes -= bytes;
        wake(s->producer_wake, wakes);
      }
      complete_all(wakes);
    }

    /// Stops every load and frees every unit not handed out (on the executor).
    static void stop(const std::shared_ptr<State>& s) {
      std::vector<std::shared_ptr<Slot>> to_cancel, to_free;
      std::vector<CompletionSource> wakes;
      {
        std::lock_guard lock(s->mutex);
        if (s->stopping) return;
        s->stopping = true;
        for (auto& slot : s->loading)
          if (slot->loading) to_cancel.push_back(slot);
        for (auto& slot : s->queue)
          if (!slot->loading && slot->module) {
            slot->owners.clear();  // freed, not parked: nobody took it
            to_free.push_back(slot);
          }
        s->queue.clear();
        wake(s->producer_wake, wakes);
        wake(s->consumer_wake, wakes);
      }
      for (auto& slot : to_cancel) slot->cancel.emit(asio::cancellation_type::terminal);
      complete_all(wakes);
      for (auto& slot : to_free) release(s, slot);
    }

    /// Waits for `c` to finish, success or failure alike.
    static asio::awaitable<void> settle(Completion c) {
      try {
        co_await c.async_wait(asio::use_awaitable);
      } catch (...) {
        // Callers inspect the state, not the wake-up.
      }
    }

    /// Waits until the producer and every load have finished.
    static asio::awaitable<void> drain(std::shared_ptr<State> s) {
      co_await s->producer_exit.async_wait(asio::use_awaitable);
      std::vector<Completion> loads;
      {
        std::lock_guard lock(s->mutex);
        for (auto& slot : s->loading) loads.push_back(slot->done);
      }
      co_await settle(when_all(loads));
    }

    /// async_close's coroutine.
    static asio::awaitable<void> close(std::shared_ptr<State> s) {
      stop(s);
      co_await drain(s);
    }

    /// The consumer's side: the next unit in order.
    static asio::awaitable<Unit> next(std::shared_ptr<State> s) {
      const Clock::time_point asked = Clock::now();
      co_await asio::this_coro::throw_if_cancelled(false);
      asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
      if (cancel_state.slot().is_connected()) cancel_state.slot().assign([s](asio::cancellation_type) { stop(s); });
      struct ClearSlot {
        asio::cancellation_state& state;
        ~ClearSlot() {
          if (state.slot().is_connected()) state.slot().clear();
        }
      } clear_slot{cancel_state};

      {
        std::lock_guard lock(s->mutex);
        if (s->consumer_busy)
          throw Error(errc::invalid_argument, {},
                      "async_next was called while another async_next of this pipeline is still waiting");
        s->consumer_busy = true;
      }
      struct NotBusy {
        State& state;
        ~NotBusy() {
          std::lock_guard lock(state.mutex);
          state.consumer_busy = false;
        }
      } not_busy{*s};

      for (;;) {
        std::shared_ptr<Slot> slot;
        Completion wait;
        std::exception_ptr terminal;
        bool stopped = false, end = false;
        {
          std::lock_guard lock(s->mutex);
          if (s->terminal) {
            terminal = s->terminal;
          } else if (s->stopping) {
            stopped = true;
          } else if (!s->queue.empty()) {
            slot = s->queue.front();
            wait = slot->done;
          } else if (s->producer_done) {
            end = true;
          } else {
            s->consumer_wake.emplace();
            wait = s->consumer_wake->completion();
          }
        }
        if (terminal) std::rethrow_exception(terminal);
        if (stopped) {
          co_await drain(s);
          throw Error(errc::cancelled, {}, "the prefetch pipeline was cancelled or closed");
        }
        if (end) co_return Unit();
        co_await settle(wait);
        if (!slot) continue;

        std::exception_ptr failure;
        {
          std::lock_guard lock(s->mutex);
          if (s->stopping) continue;  // reported above, after the drain
          s->queue.pop_front();
          if (slot->error) {
            failure = slot->error;
            s->terminal = failure;
          } else {
            slot->stall = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - asked);
            UnitTiming timing{slot->index,
                              slot->pass,
                              s->bytes[slot->index],
                              std::chrono::duration<double>(slot->finished - slot->started).count(),
                              std::chrono::duration<double>(slot->stall).count(),
                              slot->from_host};
            s->stats.stall_s += timing.stall_s;
            s->stats.load_s += timing.load_s;
            ++s->stats.delivered;
            s->stats.units.push_back(timing);
            if (s->stats.units.size() > s->options.timing_history) s->stats.units.pop_front();
          }
        }
        if (failure) {
          // The failed unit's reservation is already back; free what was loaded after it.
          stop(s);
          co_await drain(s);
          std::rethrow_exception(failure);
        }
        co_return Unit(s, std::move(slot));
      }
    }
  };

  std::shared_ptr<State> state_;
};

}  // namespace eredu::engine
