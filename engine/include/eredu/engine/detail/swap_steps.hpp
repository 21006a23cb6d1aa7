#pragma once
/// \file
/// The steps of the swap core (swap_core.hpp) that every model slot takes alike: the claim that
/// keeps swaps of one slot apart, the cancellation checks between steps, the load options that
/// verify the swap's checksums as each tensor lands, and the canary. Each step records its time
/// in the SwapReport; each failure leaves the serving version untouched and says which version keeps serving.

#include <asio/awaitable.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/orchestration/materialize_options.hpp"
#include "eredu/engine/serving/swap_options.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"

namespace eredu::engine::detail {

/// The clock every step is timed with.
using SwapClock = std::chrono::steady_clock;

/// Seconds from `t` to now.
inline double seconds_since(SwapClock::time_point t) {
  return std::chrono::duration<double>(SwapClock::now() - t).count();
}

/// Records a swap step that ran from `t` to now on the trace timeline (when tracing).
inline void trace_step(const char* step, SwapClock::time_point t) { trace::record(step, "swap", t, SwapClock::now()); }

/// Holds a slot's swap flag for the lifetime of one swap: one swap of a slot at a time.
class SwapClaim {
 public:
  /// Claims `swapping`; throws OrchestrationError(swap_in_progress) naming `origin` when
  /// another swap holds it.
  SwapClaim(std::atomic<bool>& swapping, std::string_view origin) : swapping_(swapping) {
    if (swapping_.exchange(true, std::memory_order_acq_rel))
      throw OrchestrationError(errc::swap_in_progress, {},
                               fmt::format("cannot swap to {}: another swap of this slot is still running",
                                           origin.empty() ? std::string_view("a new version") : origin));
  }
  /// Lets the next swap claim the slot.
  ~SwapClaim() { swapping_.store(false, std::memory_order_release); }
  SwapClaim(const SwapClaim&) = delete;
  SwapClaim& operator=(const SwapClaim&) = delete;

 private:
  std::atomic<bool>& swapping_;
};

/// The cancellation checks of one swap: between steps, a cancelled swap stops with
/// Error(cancelled), saying which version keeps serving.
class SwapCancellation {
 public:
  /// Checks `state` (the swap coroutine's); `what` names the swap in messages ("swap",
  /// "in-place swap"), `serving` the version that keeps serving.
  SwapCancellation(asio::cancellation_state state, std::string_view what, std::uint64_t serving)
      : state_(std::move(state)), what_(what), serving_(serving) {}
  /// Checks `flag` instead: for a swap whose coroutine runs without the caller's cancellation
  /// slot (a distributed swap, which must reach its vote however early it is cancelled).
  SwapCancellation(std::shared_ptr<const std::atomic<bool>> flag, std::string_view what, std::uint64_t serving)
      : flag_(std::move(flag)), what_(what), serving_(serving) {}

  /// Throws Error(cancelled) if the swap was cancelled; `step` says where ("after the load").
  void check(std::string_view step) const {
    if (state_.cancelled() != asio::cancellation_type::none || (flag_ && flag_->load(std::memory_order_acquire)))
      throw Error(errc::cancelled, {},
                  fmt::format("the {} was cancelled {}; version {} keeps serving", what_, step, serving_));
  }

 private:
  asio::cancellation_state state_{};
  std::shared_ptr<const std::atomic<bool>> flag_{};
  std::string_view what_;
  std::uint64_t serving_;
};

/// Bytes the weights of `plan` occupy (its declarations, checked against `catalog`).
inline std::uint64_t plan_bytes(const WeightBindingPlan& plan, const io::Catalog& catalog) {
  std::uint64_t bytes = 0;
  for (const InferredWeight& w : plan.check(catalog)) bytes += w.bytes;
  return bytes;
}

/// The load options of one swap: the caller's progress counters (or `own` when it gave none)
/// and, when the swap has checksums, their verification inside the load — each tensor hashed
/// where it landed as soon as it is in, while the others are read (verify_options.hpp) —
/// instead of a second pass over the checkpoint after it.
template <class Model>
MaterializeOptions swap_load_options(const SwapOptions<Model>& options, MaterializeProgress& own) {
  MaterializeOptions load{.progress = options.progress ? options.progress : &own};
  if (!options.checksums.empty()) load.verify = VerifyOptions{.mode = VerifyMode::on, .checksums = options.checksums};
  return load;
}

/// Runs `canary` on `model` and records its time in `report`; any exception rejects the
/// version with OrchestrationError(canary_failed) saying that version `serving` keeps serving.
template <class Model>
asio::awaitable<void> canary_step(const std::function<asio::awaitable<void>(const Model&)>& canary, const Model& model,
                                  std::uint64_t serving, SwapReport& report) {
  const SwapClock::time_point t = SwapClock::now();
  std::exception_ptr rejected;
  try {
    co_await canary(model);
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
  trace_step("canary", t);
}

}  // namespace eredu::engine::detail
