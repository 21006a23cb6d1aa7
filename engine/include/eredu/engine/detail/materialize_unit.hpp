#pragma once
/// \file
/// materialize_unit: the orchestration coroutine behind async_materialize, which the load,
/// the prefetch pipeline and both model slots run inside their own coroutines.
///
/// The order of events, and why:
///  1. The plan is checked against the catalog (every recipe inferred, every declared byte
///     count compared) before any read: a bad plan costs no I/O.
///  2. Every owner's realization is started at once: reads, conversions and recipe execution
///     of different tensors overlap, limited only by the lease pool (staging) and the reader's
///     queue depth.
///  3. When one fails, the others are told to stop (std::stop_token) and the orchestration
///     waits until every one has completed — so every lease is back in its pool and no
///     backend work still writes into a weight — before it reports the first root-cause
///     error, with the parameter named. Nothing is returned, so nothing can be published.
///  4. Aliases get another handle to their owner's storage: never a copy, never a re-read.

#include <asio/awaitable.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <stop_token>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/materialize_options.hpp"
#include "eredu/engine/materialized_unit.hpp"
#include "eredu/engine/parameter_backend.hpp"
#include "eredu/engine/parameter_error.hpp"
#include "eredu/engine/weight_binding_plan.hpp"
#include "eredu/io/checkpoint_source.hpp"

namespace eredu::engine::detail {

/// Realizes every binding of `plan` on backend B (see file comment). A terminal cancellation
/// of the calling coroutine stops every realization at its next step; the unit is then awaited
/// whole, like any failure, and the coroutine throws Error(cancelled).
template <ParameterBackend B>
asio::awaitable<MaterializedUnit<B>> materialize_unit(io::CheckpointSource& source,
                                                      std::shared_ptr<const WeightBindingPlan> plan,
                                                      typename B::MaterializationContext& context,
                                                      MaterializeOptions options) {
  // 1. Before any read.
  std::vector<InferredWeight> inferred = plan->check(source.catalog());
  std::vector<const WeightBinding*> owners = plan->owners();
  if (options.progress) {
    std::uint64_t bytes = 0;
    for (auto& w : inferred) bytes += w.bytes;
    options.progress->owners_total = owners.size();
    options.progress->bytes_total = bytes;
  }

  // Cancellation (an Asio cancellation slot bound to the completion token) stops every
  // realization at its next step; the unit is then awaited whole, like any failure.
  std::stop_source stop;
  auto cancelled_by_caller = std::make_shared<std::atomic<bool>>(false);
  co_await asio::this_coro::throw_if_cancelled(false);
  asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
  if (cancel_state.slot().is_connected()) {
    cancel_state.slot().assign([stop, cancelled_by_caller](asio::cancellation_type) mutable {
      cancelled_by_caller->store(true);
      stop.request_stop();
    });
  }

  // 2. Start every owner.
  std::vector<typename B::Materialization> in_flight;
  in_flight.reserve(owners.size());
  std::exception_ptr start_error;
  std::size_t started = 0;
  for (; started < owners.size(); ++started) {
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
      stop.request_stop();
      break;
    }
    std::uint64_t bytes = inferred[started].bytes;
    B::completion(in_flight.back())
        .on_complete([stop, progress = options.progress, bytes](std::exception_ptr e) mutable {
          if (e) {
            stop.request_stop();
          } else if (progress) {
            progress->owners_done.fetch_add(1, std::memory_order_relaxed);
            progress->bytes_done.fetch_add(bytes, std::memory_order_relaxed);
          }
        });
  }

  // 3. Wait for every started realization, failed or not, before deciding anything.
  std::vector<Completion> completions;
  completions.reserve(in_flight.size());
  for (auto& m : in_flight) completions.push_back(B::completion(m));
  Completion all = when_all(completions);
  try {
    co_await all.async_wait(asio::use_awaitable);
  } catch (...) {
    // Inspected per owner below, so the error can name its parameter.
  }
  std::exception_ptr failure;
  for (std::size_t i = 0; i < in_flight.size(); ++i) {
    std::exception_ptr e = completions[i].error();
    if (!e) continue;
    if (!failure || (is_cancellation(failure) && !is_cancellation(e))) failure = attach_parameter(e, owners[i]->name());
  }
  if (start_error && (!failure || is_cancellation(failure))) failure = start_error;
  if (cancel_state.slot().is_connected()) cancel_state.slot().clear();
  if (cancelled_by_caller->load() && (!failure || is_cancellation(failure)))
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
