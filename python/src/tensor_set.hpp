#pragma once
/// \file
/// What the Python module asks eredu to load, and the module it loads it into: a ReadSpec per
/// tensor (an app::TensorRequest — checkpoint key, selection, optional cast — and how Python will
/// see it), a TensorSet that turns a list of them into one app::TensorSetModule checked against
/// the catalog, and the views that module's tensors reach Python through.
///
/// One list of specs is one atomic unit: safe_open's get_tensor is a unit of one, load_file a
/// unit of every tensor, a prefetch unit a layer. Binding names are app::TensorSetModule's.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlpack_tensor.hpp"
#include "eredu/app/tensor_set_module.hpp"
#include "eredu/cpu/parameter.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::python {

/// One tensor to load and how Python sees it (see file comment).
struct ReadSpec : app::TensorRequest {
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

/// An app::TensorSetModule with the specs its tensors reach Python through.
class TensorSetModule {
 public:
  /// The slots and their plan.
  app::TensorSetModule set;
  /// The specs the slots come from (keys, views). Shared by every unbound() copy, so a
  /// hot-swapped version carries its own export rules.
  std::shared_ptr<const std::vector<ReadSpec>> specs;
  /// Visits every slot read-only.
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
    set.visit_parameters(v, prefix);
  }
  /// Visits every slot for binding.
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
    set.visit_parameters_mut(v, prefix);
  }
  /// A copy with the same slots and nothing bound.
  TensorSetModule unbound() const { return {set.unbound(), specs}; }
};

/// The plan and the empty module of a list of specs, checked against a catalog.
struct TensorSet {
  TensorSetModule module;  ///< one unbound slot per spec

  /// One binding per spec, in spec order.
  const engine::WeightBindingPlan& plan() const noexcept { return module.set.plan(); }

  /// Builds both. Throws, before any read, what app::TensorSetModule::build throws, and
  /// Error(invalid_argument) (a view the dtype does not allow), Error(size_overflow) (a shape
  /// the framework cannot hold, exported_shape) — each naming file and tensor.
  static TensorSet build(const io::Catalog& catalog, const std::vector<ReadSpec>& specs);
};

/// The Python tensors bound in `module` (every slot bound), in slot order. GIL held.
pybind11::list export_module(const TensorSetModule& module);
/// The tensor names of `module`, in slot order. GIL held.
pybind11::list export_keys(const TensorSetModule& module);

/// The Python tensors of loaded `tensors` (one per spec, same order), as eredu._native.Tensor
/// objects. Call with the GIL held.
pybind11::list export_tensors(const std::vector<cpu::Tensor>& tensors, const std::vector<ReadSpec>& specs);

}  // namespace eredu::python
