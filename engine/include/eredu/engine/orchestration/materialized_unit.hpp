#pragma once
/// \file
/// eredu::engine::MaterializedUnit: one fully realized atomic unit, keyed by stable
/// parameter identity, ready to bind.

#include <map>
#include <utility>

#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/description/parameter_id.hpp"

namespace eredu::engine {

/// The realized weights of one unit (owners and aliases). Move-only in practice: it owns
/// the weights until bind_materialized_unit consumes it.
template <ParameterBackend B>
class MaterializedUnit {
 public:
  /// Realized weights by identity.
  using Weights = std::map<ParameterId, typename B::MaterializedWeight>;

  MaterializedUnit() = default;
  /// Wraps already realized weights.
  explicit MaterializedUnit(Weights weights) : weights_(std::move(weights)) {}

  /// Number of realized values.
  std::size_t size() const noexcept { return weights_.size(); }
  /// True when there are none.
  bool empty() const noexcept { return weights_.empty(); }
  /// True when `id` has a value.
  bool contains(const ParameterId& id) const { return weights_.contains(id); }
  /// The value of `id`, or nullptr.
  const typename B::MaterializedWeight* find(const ParameterId& id) const {
    auto it = weights_.find(id);
    return it == weights_.end() ? nullptr : &it->second;
  }
  /// Every value, by identity.
  const Weights& weights() const noexcept { return weights_; }
  /// Gives the weights up (binding consumes them).
  Weights release() && { return std::move(weights_); }

 private:
  Weights weights_;
};

}  // namespace eredu::engine
