#pragma once
/// \file
/// materialize_unit: the orchestration coroutine behind async_materialize, which the load,
/// the prefetch pipeline and both model slots run inside their own coroutines.
///
/// The order of events, and why:
///  1. The plan is checked against the catalog (every recipe inferred, every declared byte
///     count compared) before any read: a bad plan costs no I/O.
///  2. A ReservingBackend is told the unit's bytes first, so that it allocates for every owner
///     at once rather than between the reads the window below lets run (an mmap during them
///     holds their page faults on the process's mmap lock).
///     Then the owners' realizations are started in order, up to max_realizations_in_flight and
///     max_bytes_in_flight at a time: reads, conversions and recipe execution of different
///     tensors overlap, limited by the lease pool (staging) and the reader's queue depth. The
///     window is above what a reader keeps in flight, so it costs no overlap; it is what lets
///     a stop end a unit at once, since the realizations not started are never started (a
///     unit of 100 000 tiny tensors, or 2 GiB of large ones, otherwise read to its end after
///     the stop). A started one's read drops its queued requests when the backend binds the
///     stop to it (the CPU backend does: detail::StopCancellation; io::Reader::cancel).
///  3. When one fails, the others are told to stop (std::stop_token) and the orchestration
///     waits until every one has completed — so every lease is back in its pool and no
///     backend work still writes into a weight — before it reports the first root-cause
///     error, with the parameter named. Nothing is returned, so nothing can be published.
///  4. Aliases get another handle to their owner's storage: never a copy, never a re-read.
/// With MaterializeOptions::verify on, the digests are matched to the owners before step 2
/// (load_verification.hpp): an owner hashed in place completes only once its hash matched;
/// the tensors checked by re-reading the file are hashed alongside the owners, and the unit
/// waits for that check too.

#include <asio/awaitable.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/async_event.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/detail/ignore_cancellation.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/reserving_backend.hpp"
#include "eredu/engine/description/parameter_error.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/detail/load_verification.hpp"
#include "eredu/engine/orchestration/materialize_options.hpp"
#include "eredu/engine/orchestration/materialized_unit.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace eredu::engine::detail {

/// Realizations of one unit started and not yet complete, at most (see step 2 above).
inline constexpr std::size_t max_realizations_in_flight = 256;
/// Bytes of the realizations started and not yet complete, at most, unless one realization
/// alone is larger (see step 2 above): four times what a reader keeps in flight by default
/// (depth 8 × 8 MiB), and what a local disk reads in about a tenth of a second.
inline constexpr std::uint64_t max_bytes_in_flight = std::uint64_t{256} << 20;

/// Whether a cancelled unit's weights may be freed after its caller was told (B declares
/// `weights_release_alone`: a weight holds everything its release needs, so it may outlive
/// the backend's context). Freeing a partly loaded unit takes time (a process holding 2 GiB
/// needs about half a second to give it back here, docs/performance.md): a cancelled load's
/// caller should not wait for it. A unit that failed otherwise frees them before it reports.
template <class B>
concept ReleasesLate = requires {
  requires B::weights_release_alone;
};

/// Destroys `held` in a task posted to `executor`: after the handler the caller's completion
/// dispatches from there now. Destroyed at once when no memory is left to post it.
template <class T>
void release_later(const asio::any_io_executor& executor, T held) {
  try {
    auto box = std::make_shared<T>(std::move(held));
    asio::post(executor, [box = std::move(box)]() mutable { box.reset(); });
  } catch (...) {
    // Freed here, on the way to the caller's error.
  }
}

/// An owner's hash check where it landed: another handle to the weight, and its digest.
template <class B>
struct InPlaceCheck {
  typename B::MaterializedWeight weight;  ///< shares the realization's storage
  io::DigestCheck digest;                 ///< what its bytes must hash to
};

/// One owner's steps once its realization has started: waits for it (`done`, the backend's
/// completion: the bridge from its threads), then, when `check` is set, hashes the weight
/// where it landed (B::verify_weight) and counts it verified. Throws the first failing step's
/// error. Runs to its end whatever the caller's cancellation: the realization itself is
/// stopped through the unit's stop_token.
template <class B>
asio::awaitable<void> settle_owner(typename B::MaterializationContext& context, Completion done,
                                   std::optional<InPlaceCheck<B>> check, MaterializeProgress* progress) {
  co_await done.async_wait(eredu::detail::use_awaitable_ignoring_cancellation());
  if constexpr (VerifyingBackend<B>) {
    if (check) {
      const std::uint64_t bytes = check->digest.bytes;
      Completion hashed = B::verify_weight(context, check->weight, std::move(check->digest));
      co_await hashed.async_wait(eredu::detail::use_awaitable_ignoring_cancellation());
      if (progress) {
        progress->tensors_verified.fetch_add(1, std::memory_order_relaxed);
        progress->bytes_verified.fetch_add(bytes, std::memory_order_relaxed);
      }
    }
  } else {
    (void)context, (void)check, (void)progress;  // nothing is hashed in place
  }
}

/// Realizes every binding of `plan` on backend B (see file comment). A terminal cancellation
/// of the calling coroutine stops every realization at its next step; the unit is then awaited
/// whole, like any failure, and the coroutine throws Error(cancelled). `quiet_verification`
/// leaves out the log line on what cannot be verified (a pipeline says it once, not per unit).
///
/// `Source` is any io::ByteSource B reads from. The re-read check (verification.reread) runs
/// io::async_verify_checksums, which reads a local checkpoint only: on another source a plan
/// that needs it fails with invalid_argument before any read, rather than going unchecked.
template <class B, io::ByteSource Source>
asio::awaitable<MaterializedUnit<B>> materialize_unit(
    Source& source, std::shared_ptr<const WeightBindingPlan> plan, typename B::MaterializationContext& context,
    MaterializeOptions options, bool quiet_verification = false) requires ParameterBackend<B, Source> {
  // 1. Before any read.
  std::vector<InferredWeight> inferred = plan->check(source.catalog());
  std::vector<const WeightBinding*> owners = plan->owners();
  LoadVerification verification = plan_verification<B>(options.verify, source.catalog(), owners, quiet_verification);
  if constexpr (!std::same_as<Source, io::CheckpointSource>) {
    if (!verification.reread.empty())
      throw Error(errc::invalid_argument, {},
                  fmt::format("verifying {} tensor(s) of this load means re-reading them, which only a local "
                              "checkpoint (io::CheckpointSource) can do; load without verify, or from a checkpoint",
                              verification.reread.size()));
  }
  std::uint64_t unit_bytes = 0;
  for (auto& w : inferred) unit_bytes += w.bytes;
  if (options.progress) {
    options.progress->tensors_unverified.fetch_add(verification.unverified, std::memory_order_relaxed);
    options.progress->owners_total = owners.size();
    options.progress->bytes_total = unit_bytes;
  }
  // Every owner's allocation set up now, before the window of step 2 starts them a few at a
  // time: allocating between reads costs the reads (reserving_backend.hpp).
  if constexpr (ReservingBackend<B>) B::reserve_storage(context, unit_bytes);

  // Cancellation (an Asio cancellation slot bound to the completion token) stops every
  // realization at its next step; the unit is then awaited whole, like any failure.
  std::stop_source stop;
  auto cancelled_by_caller = std::make_shared<std::atomic<bool>>(false);
  // The window of step 2: realizations completed so far, and an event set at each completion
  // (and at a stop) for the coroutine waiting to start the next one. Shared: a completion's
  // callback may still run once the coroutine is gone.
  struct Window {
    std::mutex mutex;
    std::size_t completed = 0;
    std::uint64_t bytes = 0;                 // of the realizations started and not complete
    std::vector<std::exception_ptr> errors;  // per owner started: its first failing step
    bool reread_pending = false;             // the re-read check has not ended
    std::exception_ptr reread_error;         // how it ended
    AsyncEvent progressed;
  };
  auto window = std::make_shared<Window>();
  window->errors.resize(owners.size());
  co_await asio::this_coro::throw_if_cancelled(false);
  asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
  // Puts the stop in the coroutine's cancellation slot, and stops now if a cancellation came
  // while it was not there: before this step (it reached co_spawn's handler), or during a
  // wait (Asio clears the slot whenever an awaited operation completes, so this runs again
  // after every wait).
  auto listen = [&] {
    if (cancel_state.slot().is_connected()) {
      cancel_state.slot().assign([stop, cancelled_by_caller, window](asio::cancellation_type) mutable {
        cancelled_by_caller->store(true);
        stop.request_stop();
        window->progressed.set();
      });
    }
    if (cancel_state.cancelled() != asio::cancellation_type::none) {
      cancelled_by_caller->store(true);
      stop.request_stop();
    }
  };
  listen();

  // 2. Start every owner, and the re-read check beside them. Each owner's steps after its
  // start (its realization, then its in-place check) are one coroutine, settle_owner, spawned
  // on the source's executor; its end, on that executor, frees its room in the window.
  std::vector<typename B::Materialization> in_flight;
  in_flight.reserve(owners.size());
  if constexpr (std::same_as<Source, io::CheckpointSource>) {
    if (!verification.reread.empty()) {
      io::VerifyChecksumsOptions reread_options{.preferred = options.verify.preferred};
      const std::uint64_t tensors = verification.reread.size() + verification.reread.shard_count();
      window->reread_pending = true;
      // It runs to its end even when the load fails or is cancelled (it only reads and hashes);
      // the unit waits for it either way, so nothing it uses is gone before it is.
      io::async_verify_checksums(
          source, std::move(verification.reread), asio::any_io_executor(), reread_options,
          [window, stop, progress = options.progress, tensors](std::exception_ptr e, std::uint64_t bytes) mutable {
            if (e) {
              stop.request_stop();
            } else if (progress) {
              progress->tensors_verified.fetch_add(tensors, std::memory_order_relaxed);
              progress->bytes_verified.fetch_add(bytes, std::memory_order_relaxed);
            }
            std::lock_guard lock(window->mutex);
            window->reread_pending = false;
            window->reread_error = std::move(e);
            window->progressed.set();
          });
    }
  }
  std::exception_ptr start_error;
  std::size_t started = 0;
  // Until `condition` holds (checked under the window's mutex): waits for the window's event,
  // set at each owner's end, at the re-read check's end and at a stop.
  auto wait_until = [&](auto condition) -> asio::awaitable<void> {
    for (;;) {
      {
        std::lock_guard lock(window->mutex);
        if (condition()) co_return;
        window->progressed.reset();
      }
      // Not the coroutine's cancellation slot: the handler assigned above must stay there.
      try {
        co_await window->progressed.async_wait(eredu::detail::use_awaitable_ignoring_cancellation());
      } catch (...) {
        // Only a destroyed event fails a wait, and this one lives as long as the window.
      }
      listen();
    }
  };
  for (; started < owners.size(); ++started) {
    // Room in the window, unless the unit is stopping: then nothing more starts.
    co_await wait_until([&] {
      return stop.stop_requested() ||
             (started - window->completed < max_realizations_in_flight &&
              (window->bytes == 0 || window->bytes + inferred[started].bytes <= max_bytes_in_flight));
    });
    if (stop.stop_requested()) break;
    const std::uint64_t owner_bytes = inferred[started].bytes;
    {
      std::lock_guard lock(window->mutex);
      window->bytes += owner_bytes;
    }
    const WeightBinding& owner = *owners[started];
    try {
      if (const DerivedWeightRecipe* recipe = owner.recipe()) {
        in_flight.push_back(B::materialize_recipe(source, *recipe, context, stop.get_token()));
      } else {
        io::TensorReadRequest request{owner.checkpoint_key(), owner.selection()};
        in_flight.push_back(B::materialize(source, request, context, stop.get_token()));
      }
    } catch (...) {
      start_error = attach_parameter(std::current_exception(), owner.name());
      std::lock_guard lock(window->mutex);
      window->bytes -= owner_bytes;
      stop.request_stop();
      break;
    }
    std::optional<InPlaceCheck<B>> check;
    if constexpr (VerifyingBackend<B>) {
      if (std::optional<io::DigestCheck>& digest = verification.in_place[started])
        check =
            InPlaceCheck<B>{B::share_materialized_weight(B::materialized_weight(in_flight.back())), std::move(*digest)};
    }
    asio::co_spawn(source.get_executor(),
                   settle_owner<B>(context, B::completion(in_flight.back()), std::move(check), options.progress),
                   [window, stop, index = started, progress = options.progress,
                    bytes = owner_bytes](std::exception_ptr e) mutable {
                     if (e) {
                       stop.request_stop();
                     } else if (progress) {
                       progress->owners_done.fetch_add(1, std::memory_order_relaxed);
                       progress->bytes_done.fetch_add(bytes, std::memory_order_relaxed);
                     }
                     std::lock_guard lock(window->mutex);
                     window->errors[index] = std::move(e);
                     ++window->completed;
                     window->bytes -= bytes;
                     window->progressed.set();
                   });
  }

  // 3. Wait for every started realization (and every check), failed or not, before deciding
  // anything.
  co_await wait_until([&] { return window->completed == started && !window->reread_pending; });
  std::exception_ptr failure;
  for (std::size_t i = 0; i < in_flight.size(); ++i) {
    std::exception_ptr e = window->errors[i];
    if (!e) continue;
    if (!failure || (is_cancellation(failure) && !is_cancellation(e))) failure = attach_parameter(e, owners[i]->name());
  }
  // The re-read check names its tensor; no single parameter owns it.
  if (std::exception_ptr e = window->reread_error; e && (!failure || (is_cancellation(failure) && !is_cancellation(e))))
    failure = e;
  if (start_error && (!failure || is_cancellation(failure))) failure = start_error;
  if (cancel_state.slot().is_connected()) cancel_state.slot().clear();
  const bool cancelled = cancelled_by_caller->load() && (!failure || is_cancellation(failure));
  if constexpr (ReleasesLate<B>) {
    // Every realization has completed (nothing writes into the weights, every lease is back):
    // only freeing the partial unit is left, which need not delay the cancellation.
    if (cancelled) release_later(source.get_executor(), std::move(in_flight));
  }
  if (cancelled)
    throw Error(errc::cancelled, {},
                fmt::format("the load of {} weight(s) was cancelled; nothing was published", owners.size()));
  if (failure) std::rethrow_exception(failure);

  // 4. Collect owners, then share them with aliases.
  typename MaterializedUnit<B>::Weights weights;
  for (std::size_t i = 0; i < in_flight.size(); ++i)
    weights.emplace(owners[i]->id(), B::finish_materialization(std::move(in_flight[i])));
  for (auto [alias, owner] : plan->aliases())
    weights.emplace(alias->id(), B::share_materialized_weight(weights.at(owner->id())));
  co_return MaterializedUnit<B>(std::move(weights));
}

}  // namespace eredu::engine::detail
