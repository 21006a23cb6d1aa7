#pragma once
/// \file
/// Keep-on-host for the prefetch pipeline: a released unit's owner weights are demoted to
/// backend host buffers, and promoted from them on a later pass instead of being read again.
/// Only a TransferBackend has host buffers, so every piece here requires one; a pipeline over
/// any other backend has an empty ParkingLot and no way to ask for parking.

#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"
#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/orchestration/materialized_unit.hpp"

namespace eredu::engine::detail {

/// The owners of one unit, each with its weight, in plan order.
template <ParameterBackend B>
using OwnerWeights = std::vector<std::pair<ParameterId, typename B::MaterializedWeight>>;

/// Host copies of one unit's owners.
template <TransferBackend B>
struct ParkedUnit {
  std::vector<std::pair<ParameterId, typename B::HostBuffer>> buffers;  ///< one per owner
  Completion ready;                                                     ///< the demotion copies; promote only after it
};

/// Where a pipeline keeps parked units: nothing, for a backend without host transfer.
template <class B>
struct ParkingLot {
  /// Parking is off: no executor to demote and promote on.
  static constexpr bool enabled() noexcept { return false; }
  /// Nothing to size.
  void resize(std::size_t) noexcept {}
};

/// Where a pipeline keeps parked units: per unit, once released, for a TransferBackend.
template <TransferBackend B>
struct ParkingLot<B> {
  typename B::Executor* executor = nullptr;                 ///< runs the copies; null: parking is off
  std::vector<std::shared_ptr<const ParkedUnit<B>>> units;  ///< per unit; null until parked

  /// True when released units are parked.
  bool enabled() const noexcept { return executor != nullptr; }
  /// One place per unit of the sequence.
  void resize(std::size_t n) { units.resize(n); }
};

/// Starts demoting `owners` to host buffers on `executor`; the unit is ready once its copies
/// are, which retain the backend storage until then.
template <TransferBackend B>
std::shared_ptr<ParkedUnit<B>> demote_unit(typename B::Executor& executor, const OwnerWeights<B>& owners) {
  auto parked = std::make_shared<ParkedUnit<B>>();
  std::vector<Completion> copies;
  for (const auto& [id, weight] : owners) {
    auto [host, copied] = B::demote(executor, weight);
    parked->buffers.emplace_back(id, std::move(host));
    copies.push_back(std::move(copied));
  }
  parked->ready = when_all(copies);
  return parked;
}

/// Brings a parked unit back from its host buffers on `executor`, sharing each owner's
/// weight with its aliases as `plan` says.
template <TransferBackend B>
asio::awaitable<MaterializedUnit<B>> promote_unit(typename B::Executor& executor, const ParkedUnit<B>& parked,
                                                  const WeightBindingPlan& plan) {
  co_await parked.ready.async_wait(asio::use_awaitable);
  typename MaterializedUnit<B>::Weights weights;
  std::vector<Completion> copies;
  for (const auto& [id, host] : parked.buffers) {
    auto [weight, copied] = B::promote(executor, host);
    weights.emplace(id, std::move(weight));
    copies.push_back(std::move(copied));
  }
  co_await when_all(copies).async_wait(asio::use_awaitable);
  for (auto [alias, owner] : plan.aliases())
    weights.emplace(alias->id(), B::share_materialized_weight(weights.at(owner->id())));
  co_return MaterializedUnit<B>(std::move(weights));
}

}  // namespace eredu::engine::detail
