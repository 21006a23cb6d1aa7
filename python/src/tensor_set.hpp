#pragma once
/// \file
/// What the Python module asks eredu to load, and the module it loads it into: a ReadSpec per
/// tensor (checkpoint key, selection, optional cast, how Python will see it), a TensorSet that
/// turns a list of them into one binding plan checked against the catalog, and the generic
/// TensorSetModule (one slot per spec) that prefetch units and slot versions bind.
///
/// One list of specs is one atomic unit: safe_open's get_tensor is a unit of one, load_file a
/// unit of every tensor, a prefetch unit a layer. Binding names are the checkpoint keys where
/// those are valid, unique parameter identities (so errors name the tensor twice, as `eredu
/// load`'s do), else "tensor_<i>".

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlpack_tensor.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/cpu/parameter.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::python {

/// One tensor to load (see file comment).
struct ReadSpec {
  std::string key;                       ///< checkpoint tensor name
  std::string name;                      ///< slot name within its unit ("" = key)
  std::optional<DType> cast;             ///< convert to this dtype on load (a cast recipe)
  Selection selection;                   ///< which elements (whole tensor by default)
  TensorView view = TensorView::stored;  ///< how Python sees the bytes
  std::optional<Shape> view_shape;       ///< the shape Python sees (integer indices dropped)
  bool numpy = false;                    ///< for numpy, which holds fewer shapes (exported_shape)
};

/// A ReadSpec from its Python form, a dict with keys key, name (str or bytes), cast, ranges
/// ([(start, stop)] or None), view, shape, numpy. Throws Error(invalid_argument) for a malformed
/// one.
ReadSpec read_spec_from(const pybind11::handle& spec);
/// read_spec_from for each element of a sequence.
std::vector<ReadSpec> read_specs_from(const pybind11::handle& specs);

/// One slot of a TensorSetModule.
struct TensorSlot {
  std::string name;          ///< parameter id within the module
  cpu::Parameter parameter;  ///< the dtype and shape the spec produces; the bound tensor
};

/// A module with one slot per spec, in spec order (see file comment).
class TensorSetModule {
 public:
  /// The slots.
  std::vector<TensorSlot> slots;
  /// The specs the slots come from (keys, views): how the bound tensors reach Python. Shared
  /// by every unbound() copy, so a hot-swapped version carries its own export rules.
  std::shared_ptr<const std::vector<ReadSpec>> specs;
  /// Visits every slot read-only.
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const;
  /// Visits every slot for binding.
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix);
  /// A copy with the same slots and nothing bound.
  TensorSetModule unbound() const;
};

/// The plan and the empty module of a list of specs, checked against a catalog.
struct TensorSet {
  engine::WeightBindingPlan plan{{}};  ///< one binding per spec, in spec order
  TensorSetModule module;              ///< one unbound slot per spec
  std::uint64_t bytes = 0;             ///< bytes the loaded tensors occupy

  /// Builds both. Throws, before any read: Error(tensor_not_found), Error(invalid_selection),
  /// RecipeError (an unsupported cast), Error(invalid_argument) (a view the dtype does not
  /// allow), Error(size_overflow) (a shape the framework cannot hold, exported_shape) — each
  /// naming file and tensor.
  static TensorSet build(const io::Catalog& catalog, const std::vector<ReadSpec>& specs);
};

/// The Python tensors bound in `module` (every slot bound), in slot order. GIL held.
pybind11::list export_module(const TensorSetModule& module);

/// The Python tensors of loaded `tensors` (one per spec, same order), as eredu._native.Tensor
/// objects. Call with the GIL held.
pybind11::list export_tensors(const std::vector<cpu::Tensor>& tensors, const std::vector<ReadSpec>& specs);

}  // namespace eredu::python
