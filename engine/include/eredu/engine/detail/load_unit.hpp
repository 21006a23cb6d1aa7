#pragma once
/// \file
/// load_unit: the coroutine behind async_load — materialize_unit, then bind, as one step.

#include <asio/awaitable.hpp>
#include <memory>

#include "eredu/engine/detail/materialize_unit.hpp"
#include "eredu/engine/orchestration/bind.hpp"

namespace eredu::engine::detail {

/// Materializes `plan` from `source` on backend B and binds the result into `module`; on
/// any failure `module` is unchanged. `quiet_verification` as for materialize_unit.
template <ParameterBackend B, class M>
asio::awaitable<void> load_unit(M& module, io::CheckpointSource& source, std::shared_ptr<const WeightBindingPlan> plan,
                                typename B::MaterializationContext& context, MaterializeOptions options,
                                bool quiet_verification = false) {
  MaterializedUnit<B> unit =
      co_await materialize_unit<B>(source, std::move(plan), context, std::move(options), quiet_verification);
  bind_materialized_unit<B>(module, std::move(unit));
}

}  // namespace eredu::engine::detail
