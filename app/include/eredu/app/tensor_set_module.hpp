#pragma once
/// \file
/// eredu::app::TensorSetModule: the generic module of the front ends — one slot per requested
/// tensor, with the binding plan that fills it. What `eredu load` loads when there is no model
/// type at hand (a mirror of the catalog), what a prefetch unit holds (a layer's tensors) and
/// what Python's get_tensor, load_file and ModelSlot bind (the user's list).
///
/// Binding names are the requested names where those are valid, unique parameter identities
/// (so errors name the tensor twice, as `eredu load`'s do), else "tensor_<i>".

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "eredu/core/selection.hpp"
#include "eredu/cpu/parameter.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::app {

/// One tensor to load: which checkpoint tensor, which part of it, converted to what.
struct TensorRequest {
  std::string key;              ///< checkpoint tensor name
  std::string name{};           ///< slot name within the module ("" = key)
  std::optional<DType> cast{};  ///< convert to this dtype on load (a cast recipe)
  Selection selection{};        ///< which elements (whole tensor by default)
};

/// What a slot will hold, offered to a caller's check before anything is read.
struct SlotShape {
  const io::TensorInfo& tensor;  ///< the checkpoint tensor it comes from
  const std::string& file;       ///< the file holding it
  DType dtype;                   ///< the dtype it is loaded as
  const Shape& shape;            ///< the shape it is loaded as
};

/// One slot per request, in request order (see file comment).
class TensorSetModule {
 public:
  /// One slot: its parameter id within the module and the tensor bound to it.
  struct Slot {
    std::string name;          ///< parameter id within the module
    cpu::Parameter parameter;  ///< the dtype and shape the request produces; the bound tensor
  };

  /// A caller's extra check of request i (e.g. that Python can view its dtype); throws to refuse.
  using Check = std::function<void(std::size_t i, const SlotShape&)>;

  /// The module of `requests`, checked against `catalog`. Throws, before any read:
  /// Error(tensor_not_found), Error(invalid_selection), RecipeError (an unsupported cast),
  /// Error(size_overflow), and what `check` throws — each naming file and tensor.
  static TensorSetModule build(const io::Catalog& catalog, const std::vector<TensorRequest>& requests,
                               const Check& check = {});

  /// Every catalog tensor, whole, in file order. With `cast_to`, every tensor that can be cast
  /// to it is (others keep their dtype); without, every tensor keeps its checkpoint dtype.
  static TensorSetModule mirror(const io::Catalog& catalog, std::optional<DType> cast_to = std::nullopt);

  /// The bindings that fill every slot.
  const engine::WeightBindingPlan& plan() const noexcept { return plan_; }
  /// Bytes the bound tensors occupy.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// Number of slots.
  std::size_t size() const noexcept { return slots_.size(); }
  /// The slot for request `index`.
  const cpu::Parameter& slot(std::size_t index) const { return slots_.at(index).parameter; }
  /// Every slot, in request order.
  const std::vector<Slot>& slots() const noexcept { return slots_; }
  /// A copy with the same slots and plan but nothing bound (for repeated loads).
  TensorSetModule unbound() const;

  /// Visits every slot read-only.
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const;
  /// Visits every slot for binding.
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix);

 private:
  TensorSetModule(std::vector<Slot> slots, engine::WeightBindingPlan plan, std::uint64_t bytes)
      : slots_(std::move(slots)), plan_(std::move(plan)), bytes_(bytes) {}
  std::vector<Slot> slots_;
  engine::WeightBindingPlan plan_;
  std::uint64_t bytes_ = 0;
};

}  // namespace eredu::app
