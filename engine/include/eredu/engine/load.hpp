#pragma once
/// \file
/// async_load: materialize a binding plan and bind it into a module, as one atomic step.
///
/// \code
///   co_await engine::async_load<cpu::Backend>(layer3, *source, plan, context, asio::use_awaitable);
/// \endcode
/// On any failure the module is left exactly as it was and every lease is back in the pool.

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>
#include <memory>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/bind.hpp"
#include "eredu/engine/materialize.hpp"

namespace eredu::engine {

namespace detail {

/// The coroutine behind async_load.
template <ParameterBackend B, class M>
asio::awaitable<void> load_unit(M& module, io::CheckpointSource& source, std::shared_ptr<const WeightBindingPlan> plan,
                                typename B::MaterializationContext& context, MaterializeOptions options) {
  MaterializedUnit<B> unit = co_await materialize_unit<B>(source, std::move(plan), context, options);
  bind_materialized_unit<B>(module, std::move(unit));
}

}  // namespace detail

/// Materializes `plan` from `source` on backend B and binds the result into `module`.
/// Completion signature: void(std::exception_ptr). `module`, `source` and `context` must
/// outlive the operation. Errors: those of async_materialize and bind_materialized_unit.
template <ParameterBackend B, class M, class Token>
requires Parameterized<M, typename B::Parameter>
auto async_load(M& module, io::CheckpointSource& source, const WeightBindingPlan& plan,
                typename B::MaterializationContext& context, Token&& token, MaterializeOptions options = {}) {
  return eredu::detail::spawn_operation(
      source.get_executor(),
      detail::load_unit<B>(module, source, std::make_shared<const WeightBindingPlan>(plan), context, options),
      std::forward<Token>(token));
}

}  // namespace eredu::engine
