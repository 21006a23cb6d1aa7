#pragma once
/// \file
/// async_load: materialize a binding plan and bind it into a module, as one atomic step.
///
/// \code
///   co_await engine::async_load<cpu::Backend>(layer3, *source, plan, context, asio::use_awaitable);
/// \endcode
/// On any failure the module is left exactly as it was and every lease is back in the pool.
/// The coroutine is detail::load_unit (detail/load_unit.hpp).

#include <asio/async_result.hpp>
#include <exception>
#include <memory>
#include <utility>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/detail/load_unit.hpp"
#include "eredu/engine/detail/load_verification.hpp"
#include "eredu/engine/orchestration/bind.hpp"
#include "eredu/engine/orchestration/materialize.hpp"

namespace eredu::engine {

/// Materializes `plan` from `source` on backend B and binds the result into `module`.
///
/// @par Completion Signature
/// `void(std::exception_ptr)`. Errors: those of async_materialize and
/// bind_materialized_unit; in every case `module` is unchanged.
///
/// @par Per-Operation Cancellation
/// terminal, as async_materialize: nothing is bound, and the operation fails with
/// errc::cancelled.
///
/// `source` is any io::ByteSource B reads from, as for async_materialize. `module`, `source`,
/// `context` and `options.progress` must outlive the operation; the plan is copied.
template <class B, class M, io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr)> Token>
requires ParameterBackend<B, Source> && Parameterized<M, typename B::Parameter>
auto async_load(M& module, Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                MaterializeOptions options, Token&& token) {
  return eredu::detail::spawn_operation(
      source.get_executor(),
      detail::load_unit<B>(module, source, std::make_shared<const WeightBindingPlan>(plan), context, options),
      std::forward<Token>(token));
}

/// async_load with default options.
template <class B, class M, io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr)> Token>
requires ParameterBackend<B, Source> && Parameterized<M, typename B::Parameter>
auto async_load(M& module, Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                Token&& token) {
  return async_load<B>(module, source, plan, context, MaterializeOptions{}, std::forward<Token>(token));
}

/// The bytes a load of `plan` on backend B reads from the file a second time to verify them
/// under `options`: the sources of recipes (a tensor-parallel rank's fused pieces, which a
/// concat rearranges) and, on a backend that cannot hash its weights in place, every
/// verifiable tensor. What a reader's byte count adds to a plan's own bytes; the rule lives in
/// detail::plan_verification, which the load itself follows. Reads nothing; logs nothing.
/// Throws what plan_verification throws, except require's refusal (the load reports that).
template <ParameterBackend B>
std::uint64_t verification_reread_bytes(const VerifyOptions& options, const io::Catalog& catalog,
                                        const WeightBindingPlan& plan) {
  VerifyOptions relaxed = options;
  if (relaxed.mode == VerifyMode::require) relaxed.mode = VerifyMode::on;
  return detail::plan_verification<B>(relaxed, catalog, plan.owners(), true).reread_bytes;
}

}  // namespace eredu::engine
