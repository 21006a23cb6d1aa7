#pragma once
/// \file
/// eredu::engine::PlanModule<P>: a generic module whose slots are whatever a plan produces —
/// one slot per binding, named after it, declared with the dtype and shape the binding's
/// recipe infers to (an alias: its owner's) — or, for tensor parallelism, what one rank of a
/// TensorParallelPlan holds. What `eredu load --tensor-parallel`, the tests and the benchmarks
/// load when there is no model type at hand; P is a backend's parameter (cpu::Parameter,
/// cuda::Parameter), built from (DType, Shape).

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/parameter_metadata.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::engine {

/// One slot per binding of a plan (see file comment).
template <class P>
requires std::constructible_from<P, DType, Shape>
class PlanModule {
 public:
  /// Slots for every binding of `plan`, in plan order, with the dtype and shape inference
  /// gives against `catalog`. Throws what plan.check throws.
  static PlanModule from_plan(const WeightBindingPlan& plan, const io::Catalog& catalog) {
    const std::vector<InferredWeight> inferred = plan.check(catalog);
    const std::vector<const WeightBinding*> owners = plan.owners();
    std::vector<ParameterMetadata> slots;
    for (const WeightBinding& b : plan.bindings()) {
      const std::string& owner = b.is_alias() ? b.owner() : b.name();
      for (std::size_t i = 0; i < owners.size(); ++i)
        if (owners[i]->name() == owner) slots.push_back({b.id(), inferred[i].dtype, inferred[i].shape});
    }
    return PlanModule(std::move(slots));
  }

  /// The slots one rank of a tensor-parallel group binds: each tensor's local shape (the whole
  /// shape for replicated tensors), in catalog order.
  static PlanModule from_tensor_parallel(const TensorParallelPlan& plan) {
    std::vector<ParameterMetadata> slots;
    for (const ShardedTensor& t : plan.tensors) slots.push_back({ParameterId(t.parameter), t.dtype, t.local_shape});
    return PlanModule(std::move(slots));
  }

  /// Number of slots.
  std::size_t size() const noexcept { return slots_.size(); }
  /// What slot `i` declares.
  const ParameterMetadata& metadata(std::size_t i) const { return slots_.at(i).metadata; }
  /// Slot `i`.
  const P& slot(std::size_t i) const { return slots_.at(i).parameter; }
  /// The slot named `name`, or nullptr.
  const P* find(std::string_view name) const {
    for (const Slot& s : slots_)
      if (s.metadata.id.str() == name) return &s.parameter;
    return nullptr;
  }
  /// The same slots with nothing bound (for repeated loads and new versions).
  PlanModule unbound() const {
    std::vector<ParameterMetadata> slots;
    for (const Slot& s : slots_) slots.push_back(s.metadata);
    return PlanModule(std::move(slots));
  }

  /// Visits every slot read-only.
  void visit_parameters(ParameterVisitor<P>& v, const std::string& prefix) const {
    for (const Slot& s : slots_) v.visit(with_prefix(s.metadata, prefix), s.parameter);
  }
  /// Visits every slot for binding.
  void visit_parameters_mut(ParameterVisitorMut<P>& v, const std::string& prefix) {
    for (Slot& s : slots_) v.visit_mut(with_prefix(s.metadata, prefix), s.parameter);
  }

 private:
  struct Slot {
    ParameterMetadata metadata;
    P parameter;
  };
  explicit PlanModule(std::vector<ParameterMetadata> slots) {
    slots_.reserve(slots.size());
    for (ParameterMetadata& m : slots) {
      P parameter(m.dtype, m.shape);
      slots_.push_back({std::move(m), std::move(parameter)});
    }
  }
  static ParameterMetadata with_prefix(const ParameterMetadata& m, const std::string& prefix) {
    if (prefix.empty()) return m;
    return {ParameterId(join_name(prefix, m.id.str())), m.dtype, m.shape};
  }

  std::vector<Slot> slots_;
};

}  // namespace eredu::engine
