#pragma once
/// \file
/// eredu::cpu::CatalogModule: a generic module whose parameters mirror a checkpoint's
/// catalog — one slot per tensor, named after it — with the binding plan that fills it.
/// What `eredu load` and the benchmarks load when there is no model type at hand.

#include <optional>
#include <string>
#include <vector>

#include "eredu/cpu/parameter.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::cpu {

/// One slot per catalog tensor, in file order (see file comment).
class CatalogModule {
 public:
  /// Mirrors `catalog`. With `cast_to`, every F16/BF16/F32/F8 tensor that can be cast to
  /// it is bound through a cast recipe (others keep their dtype); without, every tensor
  /// keeps its checkpoint dtype. A tensor name that is not a valid parameter identity gets
  /// "tensor_<index>" instead.
  static CatalogModule mirror(const io::Catalog& catalog, std::optional<DType> cast_to = std::nullopt);

  /// The bindings that fill every slot.
  const engine::WeightBindingPlan& plan() const noexcept { return plan_; }
  /// Bytes the bound tensors occupy.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// Number of slots.
  std::size_t size() const noexcept { return slots_.size(); }
  /// The slot for tensor `index` (catalog order).
  const Parameter& slot(std::size_t index) const { return slots_.at(index).parameter; }
  /// A copy with the same slots and plan but nothing bound (for repeated loads).
  CatalogModule unbound() const;

  /// Visits every slot read-only.
  void visit_parameters(engine::ParameterVisitor<Parameter>& v, const std::string& prefix) const;
  /// Visits every slot for binding.
  void visit_parameters_mut(engine::ParameterVisitorMut<Parameter>& v, const std::string& prefix);

 private:
  struct Slot {
    std::string name{};
    Parameter parameter{};
  };
  CatalogModule(std::vector<Slot> slots, engine::WeightBindingPlan plan, std::uint64_t bytes)
      : slots_(std::move(slots)), plan_(std::move(plan)), bytes_(bytes) {}
  std::vector<Slot> slots_;
  engine::WeightBindingPlan plan_;
  std::uint64_t bytes_ = 0;
};

}  // namespace eredu::cpu
