#pragma once
/// \file
/// load_unit: the coroutine behind async_load — materialize_unit, then bind, as one step.

#include <asio/awaitable.hpp>
#include <memory>

#include "eredu/engine/detail/materialize_unit.hpp"
#include "eredu/engine/orchestration/bind.hpp"

namespace eredu::engine::detail {

/// Materializes `plan` from `source` on backend B and binds the result into `module`; on
/// any failure `module` is unchanged. `source` is any io::ByteSource B reads from. `quiet_verification` as for
/// materialize_unit.
template <class B, class M, io::ByteSource Source>
requires ParameterBackend<B, Source> asio::awaitable<void> load_unit(M& module, Source& source,
                                                                     std::shared_ptr<const WeightBindingPlan> plan,
                                                                     typename B::MaterializationContext& context,
                                                                     MaterializeOptions options,
                                                                     bool quiet_verification = false) {
  MaterializedUnit<B> unit =
      co_await materialize_unit<B>(source, std::move(plan), context, std::move(options), quiet_verification);
  bind_materialized_unit<B>(module, std::move(unit));
}

}  // namespace eredu::engine::detail
