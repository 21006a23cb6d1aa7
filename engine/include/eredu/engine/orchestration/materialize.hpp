#pragma once
/// \file
/// async_materialize: realizes every owner of a binding plan concurrently on a backend, then
/// shares owners' storage with their aliases (the seed's `materialize_bindings`).
///
/// \code
///   engine::WeightBindingPlan plan(std::move(bindings));
///   auto unit = co_await engine::async_materialize<cpu::Backend>(*source, plan, context,
///                                                                asio::use_awaitable);
/// \endcode
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
/// The coroutine is detail::materialize_unit (detail/materialize_unit.hpp).

#include <asio/async_result.hpp>
#include <exception>
#include <memory>
#include <utility>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/detail/materialize_unit.hpp"
#include "eredu/engine/orchestration/materialize_options.hpp"
#include "eredu/engine/orchestration/materialized_unit.hpp"
#include "eredu/io/reading/byte_source.hpp"

namespace eredu::engine {

/// Realizes every binding of `plan` on backend B (see file comment).
///
/// @par Completion Signature
/// `void(std::exception_ptr, MaterializedUnit<B>)`. Errors: the plan's RecipeError /
/// OrchestrationError (byte_mismatch) before any read; then the first failing owner's error
/// (store errors such as io_error or unexpected_eof, BackendError) with its parameter named;
/// errc::cancelled.
///
/// @par Per-Operation Cancellation
/// terminal: every realization stops at its next step, the unit is awaited whole (every
/// lease back, no backend work still writing), and the operation fails with errc::cancelled.
///
/// `source` is any io::ByteSource B reads from (a local checkpoint, or an in-memory source in
/// a test); a verification that re-reads tensors needs an io::CheckpointSource (see
/// detail::materialize_unit). `source`, `context` and `options.progress` must outlive the
/// operation; the plan is copied.
template <class B, io::ByteSource Source,
          asio::completion_token_for<void(std::exception_ptr, MaterializedUnit<B>)> Token>
requires ParameterBackend<B, Source>
auto async_materialize(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                       MaterializeOptions options, Token&& token) {
  return eredu::detail::spawn_operation(
      source.get_executor(),
      detail::materialize_unit<B>(source, std::make_shared<const WeightBindingPlan>(plan), context, options),
      std::forward<Token>(token));
}

/// async_materialize with default options.
template <class B, io::ByteSource Source,
          asio::completion_token_for<void(std::exception_ptr, MaterializedUnit<B>)> Token>
requires ParameterBackend<B, Source>
auto async_materialize(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                       Token&& token) {
  return async_materialize<B>(source, plan, context, MaterializeOptions{}, std::forward<Token>(token));
}

}  // namespace eredu::engine
