#pragma once
/// \file
/// PipelineState: the state machine behind PrefetchPipeline — the producer coroutine that
/// starts loads while the look-ahead and the budget allow, one coroutine per load, the
/// consumer's side of async_next, release (and parking) of delivered units, stop and drain.
///
/// Every field below `mutex` is guarded by it. Two AsyncEvents signal across it: the producer
/// waits on `producer_wake` and the consumer on `consumer_wake`, each reset under the mutex
/// before its owner waits and set under the mutex by whoever changes what the owner waits for
/// (a release, a finished load, a stop), so no wake-up is lost and none is spurious. The
/// producer and the loads run on the source's executor; release() runs on any thread.

#include <algorithm>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_state.hpp>
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
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/async_event.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/detail/ignore_cancellation.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/engine/description/parameter_error.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/detail/materialize_unit.hpp"
#include "eredu/engine/detail/unit_parking.hpp"
#include "eredu/engine/orchestration/bind.hpp"
#include "eredu/engine/serving/prefetch_options.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace eredu::engine::detail {

/// The clock of load and stall times.
using PipelineClock = std::chrono::steady_clock;

/// One started load of one unit in one pass.
template <ParameterBackend B, class M>
struct PipelineSlot {
  std::size_t index = 0;
  std::size_t pass = 0;
  CompletionSource done_source;  // completed when the load has finished, either way
  Completion done = done_source.completion();
  asio::cancellation_signal cancel;  // stops the load (emitted on the executor only)
  bool loading = true;
  bool released = false;
  std::unique_ptr<M> module;  // the bound module, once loaded
  std::exception_ptr error;
  OwnerWeights<B> owners;  // keep-on-host: the owners' weights, shared with the module, to demote on release
  bool from_host = false;
  PipelineClock::time_point started = PipelineClock::now();
  PipelineClock::time_point finished;
  std::chrono::nanoseconds stall{0};
};

/// Everything a pipeline, its loads and its delivered units share (see file comment).
/// Source: the io::ByteSource every unit is read from.
template <ParameterBackend B, class M, io::ByteSource Source = io::CheckpointSource>
requires ParameterBackend<B, Source> && Parameterized<M, typename B::Parameter>
struct PipelineState {
  using Slot = PipelineSlot<B, M>;
  using ModuleFactory = std::function<M(std::size_t index)>;

  PipelineState(Source& src, typename B::MaterializationContext& ctx, PrefetchOptions opts, ModuleFactory make)
      : source(src), context(ctx), options(opts), make_module(std::move(make)) {}

  Source& source;
  typename B::MaterializationContext& context;
  const PrefetchOptions options;
  const ModuleFactory make_module;
  std::vector<std::string> names;
  std::vector<std::uint64_t> bytes;
  std::vector<std::shared_ptr<const WeightBindingPlan>> plans;
  std::uint64_t budget = 0;
  VerifyOptions verify;          // options.verify with the metadata's digests resolved once
  MaterializeProgress verified;  // the verification counters of every unit's load

  mutable std::mutex mutex;
  std::deque<std::shared_ptr<Slot>> queue;     // started, not yet handed out, in order
  std::vector<std::shared_ptr<Slot>> loading;  // loads not finished (pruned as they finish)
  ParkingLot<B> parking;                       // keep-on-host (set before the producer starts)
  std::size_t outstanding = 0;                 // started and not released
  std::size_t in_flight = 0;                   // started and still loading
  bool stopping = false;
  bool failed = false;  // a load failed: start nothing more
  bool producer_done = false;
  bool consumer_busy = false;   // an async_next is running (one at a time)
  std::exception_ptr terminal;  // delivered to the consumer; reported again after
  AsyncEvent producer_wake;     // the producer may be able to start a load
  AsyncEvent consumer_wake;     // a unit was started, or the producer is done
  CompletionSource producer_exit_source;
  Completion producer_exit = producer_exit_source.completion();
  PipelineStats stats;

  /// Checks every unit's plan against the catalog, sizes the budget and refuses a bad
  /// configuration (see PrefetchPipeline's constructor), all before any read.
  static std::shared_ptr<PipelineState> create(Source& source, std::vector<PipelineUnit> units,
                                               ModuleFactory make_module, typename B::MaterializationContext& context,
                                               PrefetchOptions options) {
    validate(options);
    auto state = std::make_shared<PipelineState>(source, context, options, std::move(make_module));
    PipelineState& s = *state;
    std::uint64_t largest = 0;
    for (PipelineUnit& unit : units) {
      std::uint64_t unit_bytes = 0;
      try {
        for (const InferredWeight& w : unit.plan.check(source.catalog())) unit_bytes += w.bytes;
      } catch (...) {
        std::rethrow_exception(qualify_parameter(std::current_exception(), unit.name));
      }
      largest = std::max(largest, unit_bytes);
      s.names.push_back(std::move(unit.name));
      s.bytes.push_back(unit_bytes);
      s.plans.push_back(std::make_shared<const WeightBindingPlan>(std::move(unit.plan)));
    }
    s.verify = options.verify;
    if (s.verify.mode != VerifyMode::off) {
      if (s.verify.checksums.empty()) s.verify.checksums = io::Checksums::from_metadata(source.catalog());
      // What cannot be verified is said once for the whole pipeline (and refused under
      // require), not once per unit load.
      std::uint64_t tensors = 0, unverified = 0;
      LoadVerification example;
      for (std::size_t i = 0; i < s.plans.size(); ++i) {
        LoadVerification v;
        try {
          v = plan_verification<B>(s.verify, source.catalog(), s.plans[i]->owners(), true);
        } catch (...) {
          std::rethrow_exception(qualify_parameter(std::current_exception(), s.names[i]));
        }
        tensors += v.tensors;
        unverified += v.unverified;
        if (v.unverified && example.first_unverified.empty()) example = std::move(v);
      }
      if (tensors > 0 && unverified == tensors)
        log::warn(
            "verification on, but none of the pipeline's {} tensor reads can be verified ({}, e.g. {}): "
            "nothing is verified",
            tensors, example.why_unverified, example.first_unverified);
      else if (unverified > 0)
        log::info("the pipeline verifies {} of its {} tensor reads; the others cannot be ({}, e.g. {})",
                  tensors - unverified, tensors, example.why_unverified, example.first_unverified);
    }
    s.parking.resize(s.plans.size());
    s.budget = options.resident_budget ? options.resident_budget : largest * (options.lookahead + 1);
    s.stats.budget = s.budget;
    for (std::size_t i = 0; i < s.bytes.size(); ++i)
      if (s.bytes[i] > s.budget)
        throw Error(errc::invalid_argument, {},
                    fmt::format("unit '{}' needs {} bytes, more than the whole resident budget of {} bytes", s.names[i],
                                s.bytes[i], s.budget));
    return state;
  }

  /// Starts the producer (loads begin when the source's executor runs).
  static void launch(const std::shared_ptr<PipelineState>& s) {
    asio::co_spawn(s->source.get_executor(), produce(s), asio::detached);
  }

  /// What the pipeline's destructor does: tells work still in flight to stop (it keeps this
  /// state alive until it returns). A pipeline closed, or run to its end with nothing
  /// loading, posts nothing, so it may outlive its event loop.
  static void abandon(const std::shared_ptr<PipelineState>& s) {
    {
      std::lock_guard lock(s->mutex);
      const bool loading =
          std::any_of(s->loading.begin(), s->loading.end(), [](const std::shared_ptr<Slot>& l) { return l->loading; });
      if (s->stopping || (s->producer_done && !loading)) return;
    }
    asio::post(s->source.get_executor(), [s] { stop(s); });
  }

  /// A snapshot of the counters.
  PipelineStats snapshot() const {
    std::lock_guard lock(mutex);
    PipelineStats out = stats;
    out.tensors_verified = verified.tensors_verified.load(std::memory_order_relaxed);
    out.bytes_verified = verified.bytes_verified.load(std::memory_order_relaxed);
    return out;
  }

  /// Waits for `event` without the calling coroutine's cancellation slot: the consumer's slot
  /// runs stop() (which sets the events), and a wait taking the slot would replace it.
  static asio::awaitable<void> settle(AsyncEvent& event) {
    try {
      co_await event.async_wait(eredu::detail::use_awaitable_ignoring_cancellation());
    } catch (...) {
      // Only a destroyed event fails a wait; callers inspect the state, not the wake-up.
    }
  }

  /// Waits for `c` to finish, success or failure alike.
  static asio::awaitable<void> settle(Completion c) {
    try {
      co_await c.async_wait(asio::use_awaitable);
    } catch (...) {
      // Callers inspect the state, not the wake-up.
    }
  }

  /// Starts units in order while the look-ahead and the budget allow.
  static asio::awaitable<void> produce(std::shared_ptr<PipelineState> s) {
    const std::size_t n = s->plans.size();
    bool running = n > 0;
    for (std::size_t pass = 0; running && (s->options.passes == 0 || pass < s->options.passes); ++pass) {
      for (std::size_t i = 0; running && i < n; ++i) {
        std::shared_ptr<Slot> slot;
        while (running) {
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
              s->consumer_wake.set();
            } else {
              s->producer_wake.reset();
            }
          }
          if (slot) break;
          co_await settle(s->producer_wake);
        }
        if (!slot) break;
        asio::co_spawn(s->source.get_executor(), load(s, slot),
                       asio::bind_cancellation_slot(slot->cancel.slot(), asio::detached));
      }
    }
    {
      std::lock_guard lock(s->mutex);
      s->producer_done = true;
      s->consumer_wake.set();
    }
    s->producer_exit_source.complete();
  }

  /// Loads one unit (read and materialize, or promote its parked copy) and binds it.
  static asio::awaitable<void> load(std::shared_ptr<PipelineState> s, std::shared_ptr<Slot> slot) {
    std::exception_ptr error;
    std::unique_ptr<M> module;
    OwnerWeights<B> owners;
    bool from_host = false;
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      module = std::make_unique<M>(s->make_module(slot->index));
      const WeightBindingPlan& plan = *s->plans[slot->index];
      MaterializedUnit<B> unit;
      if constexpr (TransferBackend<B>) {
        std::shared_ptr<const ParkedUnit<B>> parked;
        {
          std::lock_guard lock(s->mutex);
          if (s->parking.enabled()) parked = s->parking.units[slot->index];
        }
        if (parked) {
          from_host = true;
          unit = co_await promote_unit<B>(*s->parking.executor, *parked, plan);
        }
      }
      if (!from_host) {
        MaterializeOptions load{.progress = &s->verified, .verify = s->verify};
        unit = co_await materialize_unit<B>(s->source, s->plans[slot->index], s->context, std::move(load), true);
      }
      if (s->parking.enabled() && !from_host)
        for (const WeightBinding* owner : plan.owners())
          owners.emplace_back(owner->id(), B::share_materialized_weight(*unit.find(owner->id())));
      bind_materialized_unit<B>(*module, std::move(unit));
    } catch (...) {
      error = qualify_parameter(std::current_exception(), s->names[slot->index]);
      module.reset();
      owners.clear();
    }

    bool keep = false;
    std::vector<std::shared_ptr<Slot>> to_cancel;
    {
      std::lock_guard lock(s->mutex);
      slot->loading = false;
      slot->finished = PipelineClock::now();
      --s->in_flight;
      s->producer_wake.set();
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
      }
    }
    for (auto& other : to_cancel) other->cancel.emit(asio::cancellation_type::terminal);
    module.reset();
    owners.clear();
    slot->done_source.complete();
  }

  /// Gives a delivered (or abandoned) unit back; any thread.
  static void release(const std::shared_ptr<PipelineState>& s, std::shared_ptr<Slot> slot) {
    std::unique_ptr<M> module;
    OwnerWeights<B> owners;
    bool park = false;
    {
      std::lock_guard lock(s->mutex);
      if (slot->released) return;
      slot->released = true;
      module = std::move(slot->module);
      owners = std::move(slot->owners);
      --s->outstanding;
      if constexpr (TransferBackend<B>) park = !owners.empty() && !s->parking.units[slot->index];
    }
    const std::uint64_t unit_bytes = s->bytes[slot->index];
    if constexpr (TransferBackend<B>) {
      if (park) {
        // Demote while the module goes: the copies retain the backend storage until done, so
        // the bytes stay counted as resident until then.
        std::shared_ptr<const ParkedUnit<B>> parked = demote_unit<B>(*s->parking.executor, owners);
        module.reset();
        owners.clear();
        {
          std::lock_guard lock(s->mutex);
          s->stats.parked_bytes += unit_bytes;
          s->parking.units[slot->index] = parked;
        }
        parked->ready.on_complete([s, unit_bytes](std::exception_ptr) { give_back(s, unit_bytes); });
        return;
      }
    }
    module.reset();
    owners.clear();
    give_back(s, unit_bytes);
  }

  /// Returns `unit_bytes` of resident budget and wakes the producer.
  static void give_back(const std::shared_ptr<PipelineState>& s, std::uint64_t unit_bytes) {
    std::lock_guard lock(s->mutex);
    s->stats.resident_bytes -= unit_bytes;
    s->producer_wake.set();
  }

  /// Stops every load and frees every unit not handed out (on the executor).
  static void stop(const std::shared_ptr<PipelineState>& s) {
    std::vector<std::shared_ptr<Slot>> to_cancel, to_free;
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
      s->producer_wake.set();
      s->consumer_wake.set();
    }
    for (auto& slot : to_cancel) slot->cancel.emit(asio::cancellation_type::terminal);
    for (auto& slot : to_free) release(s, slot);
  }

  /// Waits until the producer and every load have finished.
  static asio::awaitable<void> drain(std::shared_ptr<PipelineState> s) {
    co_await s->producer_exit.async_wait(asio::use_awaitable);
    std::vector<Completion> loads;
    {
      std::lock_guard lock(s->mutex);
      for (auto& slot : s->loading) loads.push_back(slot->done);
    }
    co_await settle(when_all(loads));
  }

  /// async_close's coroutine.
  static asio::awaitable<void> close(std::shared_ptr<PipelineState> s) {
    stop(s);
    co_await drain(s);
  }

  /// The consumer's side of async_next: the next loaded unit in order, or null after the
  /// last pass. A terminal cancellation of the calling coroutine stops the pipeline.
  static asio::awaitable<std::shared_ptr<Slot>> next(std::shared_ptr<PipelineState> s) {
    const PipelineClock::time_point asked = PipelineClock::now();
    co_await asio::this_coro::throw_if_cancelled(false);
    asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
    // Puts stop() in the coroutine's cancellation slot, and stops now if a cancellation came
    // while it was not there: before this step (between the initiation and the coroutine's
    // start, it reached co_spawn's own handler), or during a wait (Asio clears the slot when
    // an awaited operation completes, so this runs again after every wait). No await of this
    // coroutine throws a cancellation: without this the pipeline kept loading for a consumer
    // that had gone.
    auto listen = [&] {
      if (cancel_state.slot().is_connected()) cancel_state.slot().assign([s](asio::cancellation_type) { stop(s); });
      if (cancel_state.cancelled() != asio::cancellation_type::none) stop(s);
    };
    listen();
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
      PipelineState& state;
      ~NotBusy() {
        std::lock_guard lock(state.mutex);
        state.consumer_busy = false;
      }
    } not_busy{*s};

    for (;;) {
      std::shared_ptr<Slot> slot;
      Completion loaded;
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
          loaded = slot->done;
        } else if (s->producer_done) {
          end = true;
        } else {
          s->consumer_wake.reset();
        }
      }
      if (terminal) std::rethrow_exception(terminal);
      if (stopped) {
        co_await drain(s);
        throw Error(errc::cancelled, {}, "the prefetch pipeline was cancelled or closed");
      }
      if (end) co_return nullptr;
      if (!slot) {
        co_await settle(s->consumer_wake);
        listen();
        continue;
      }
      co_await settle(loaded);
      listen();

      std::exception_ptr failure;
      {
        std::lock_guard lock(s->mutex);
        if (s->stopping) continue;  // reported above, after the drain
        s->queue.pop_front();
        if (slot->error) {
          failure = slot->error;
          s->terminal = failure;
        } else {
          slot->stall = std::chrono::duration_cast<std::chrono::nanoseconds>(PipelineClock::now() - asked);
          UnitTiming timing{slot->index,
                            slot->pass,
                            s->bytes[slot->index],
                            std::chrono::duration<double>(slot->finished - slot->started).count(),
                            std::chrono::duration<double>(slot->stall).count(),
                            slot->from_host};
          trace::record("load unit", "pipeline", slot->started, slot->finished, s->names[slot->index]);
          trace::record("stall", "pipeline", asked, asked + slot->stall, s->names[slot->index]);
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
      co_return slot;
    }
  }
};

}  // namespace eredu::engine::detail
