#include "tensor_set.hpp"

#include <fmt/format.h>

#include <set>
#include <utility>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

Error malformed(const std::string& why) {
  return Error(errc::invalid_argument, {}, fmt::format("malformed read spec: {}", why));
}

DType dtype_from(const py::handle& value) {
  const std::string name = py::str(value);
  auto d = dtype_from_name(name);
  if (!d) throw malformed(fmt::format("unknown dtype '{}'", name));
  return *d;
}

std::uint64_t u64(const py::handle& value, const char* what) {
  if (PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr())) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(value.ptr());
    if (!PyErr_Occurred()) return v;
    PyErr_Clear();
  }
  throw malformed(fmt::format("{} must be an integer from 0 to 2^64-1, not {}", what, std::string(py::repr(value))));
}

}  // namespace

ReadSpec read_spec_from(const py::handle& spec) {
  if (!py::isinstance<py::dict>(spec)) throw malformed("expected a dict");
  const py::dict d = py::reinterpret_borrow<py::dict>(spec);
  ReadSpec r;
  if (!d.contains("key")) throw malformed("no key");
  r.key = text_bytes(d["key"], "a tensor name");
  if (d.contains("name") && !d["name"].is_none()) r.name = text_bytes(d["name"], "a slot name");
  if (d.contains("cast") && !d["cast"].is_none()) r.cast = dtype_from(d["cast"]);
  if (d.contains("ranges") && !d["ranges"].is_none()) {
    for (const py::handle range : d["ranges"]) {
      if (!py::isinstance<py::tuple>(range) || py::len(range) != 2) throw malformed("a range is (start, stop)");
      const py::tuple t = py::reinterpret_borrow<py::tuple>(range);
      r.selection.ranges.push_back({u64(t[0], "a range's start"), u64(t[1], "a range's stop")});
    }
  }
  if (d.contains("view") && !d["view"].is_none()) r.view = tensor_view_from_name(py::str(d["view"]));
  if (d.contains("shape") && !d["shape"].is_none()) {
    Shape s;
    for (const py::handle dim : d["shape"]) s.push_back(u64(dim, "a dimension"));
    r.view_shape = std::move(s);
  }
  if (d.contains("numpy") && !d["numpy"].is_none()) r.numpy = d["numpy"].ptr() == Py_True;
  return r;
}

std::vector<ReadSpec> read_specs_from(const py::handle& specs) {
  std::vector<ReadSpec> out;
  for (const py::handle s : specs) out.push_back(read_spec_from(s));
  return out;
}

void TensorSetModule::visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
  for (const TensorSlot& s : slots)
    v.visit({engine::ParameterId(engine::join_name(prefix, s.name)), s.parameter.dtype, s.parameter.shape},
            s.parameter);
}

void TensorSetModule::visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
  for (TensorSlot& s : slots)
    v.visit_mut({engine::ParameterId(engine::join_name(prefix, s.name)), s.parameter.dtype, s.parameter.shape},
                s.parameter);
}

TensorSetModule TensorSetModule::unbound() const {
  TensorSetModule m;
  m.specs = specs;
  m.slots.reserve(slots.size());
  for (const TensorSlot& s : slots) m.slots.push_back({s.name, cpu::Parameter(s.parameter.dtype, s.parameter.shape)});
  return m;
}

TensorSet TensorSet::build(const io::Catalog& catalog, const std::vector<ReadSpec>& specs) {
  using R = engine::DerivedWeightRecipe;
  std::vector<engine::WeightBinding> bindings;
  TensorSet set;
  std::set<std::string> taken;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ReadSpec& spec = specs[i];
    const io::TensorInfo& info = catalog.at(spec.key);
    const std::string& file = catalog.file_of(info).path;
    std::string name = spec.name.empty() ? spec.key : spec.name;
    if (!engine::ParameterId::parse(name) || taken.contains(name)) name = fmt::format("tensor_{}", i);
    taken.insert(name);

    if (std::string why = spec.selection.check(info.shape); !why.empty())
      throw Error(
          errc::invalid_selection, {.file = file, .tensor = spec.key},
          fmt::format("selection {} of a {} tensor: {}", spec.selection.to_string(), format_shape(info.shape), why));
    const Shape shape = spec.selection.selected_shape(info.shape);
    DType dtype = info.dtype;
    std::uint64_t bytes = 0;
    if (spec.cast && *spec.cast != info.dtype) {
      R recipe = R::cast(R::source(spec.key, spec.selection), *spec.cast);
      const engine::InferredWeight inferred = recipe.infer(catalog);
      dtype = inferred.dtype;
      bytes = inferred.bytes;
      bindings.push_back(engine::WeightBinding::from_recipe(name, std::move(recipe), bytes));
    } else {
      auto elements = checked_element_count(shape);
      auto size = elements ? checked_byte_size(*elements, dtype) : std::nullopt;
      if (!size)
        throw Error(errc::invalid_selection, {.file = file, .tensor = spec.key},
                    fmt::format("selection {} of a {} {} tensor is not a whole number of bytes",
                                spec.selection.to_string(), dtype_name(dtype), format_shape(info.shape)));
      bytes = *size;
      bindings.push_back(engine::WeightBinding::tensor(name, spec.key, spec.selection, bytes));
    }
    // The view is checked now, so that a load never reads what it could not hand over.
    if (spec.view == TensorView::stored && !has_dlpack_type(dtype))
      throw Error(errc::invalid_argument, {.file = file, .tensor = spec.key},
                  fmt::format("{} has no DLPack type: ask for its raw bytes or a cast", dtype_name(dtype)));
    if (spec.view == TensorView::uint16 && dtype_bits(dtype) != 16)
      throw Error(errc::invalid_argument, {.file = file, .tensor = spec.key},
                  fmt::format("a uint16 view needs a 16-bit dtype, not {}", dtype_name(dtype)));
    if (spec.view_shape && checked_element_count(*spec.view_shape) != checked_element_count(shape))
      throw Error(errc::invalid_argument, {.file = file, .tensor = spec.key},
                  fmt::format("a view of shape {} does not have the elements of {}", format_shape(*spec.view_shape),
                              format_shape(shape)));
    (void)exported_shape(dtype, spec.view, spec.view_shape ? *spec.view_shape : shape, spec.numpy,
                         {.file = file, .tensor = spec.key});
    set.module.slots.push_back({name, cpu::Parameter(dtype, shape)});
    if (__builtin_add_overflow(set.bytes, bytes, &set.bytes))
      throw Error(errc::size_overflow, {.file = file, .tensor = spec.key}, "the tensors' bytes overflow 64 bits");
  }
  set.plan = engine::WeightBindingPlan(std::move(bindings));
  set.module.specs = std::make_shared<const std::vector<ReadSpec>>(specs);
  return set;
}

py::list export_tensors(const std::vector<cpu::Tensor>& tensors, const std::vector<ReadSpec>& specs) {
  py::list out;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    out.append(py::cast(DLPackTensor(tensors[i], specs[i].view, specs[i].view_shape, specs[i].key)));
  return out;
}

}  // namespace eredu::python

namespace eredu::python {

pybind11::list export_module(const TensorSetModule& module) {
  std::vector<cpu::Tensor> tensors;
  tensors.reserve(module.slots.size());
  for (const TensorSlot& s : module.slots) tensors.push_back(s.parameter.value);
  return export_tensors(tensors, *module.specs);
}

}  // namespace eredu::python
