#include "tensor_set.hpp"

#include <fmt/format.h>

#include <utility>

#include "eredu/core/error.hpp"
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

TensorSet TensorSet::build(const io::Catalog& catalog, const std::vector<ReadSpec>& specs) {
  const std::vector<app::TensorRequest> requests(specs.begin(), specs.end());
  // The views are checked with the rest, so that a load never reads what it could not hand over.
  auto viewable = [&](std::size_t i, const app::SlotShape& slot) {
    const ReadSpec& spec = specs[i];
    if (spec.view == TensorView::stored && !has_dlpack_type(slot.dtype))
      throw Error(errc::invalid_argument, {.file = slot.file, .tensor = spec.key},
                  fmt::format("{} has no DLPack type: ask for its raw bytes or a cast", dtype_name(slot.dtype)));
    if (spec.view == TensorView::uint16 && dtype_bits(slot.dtype) != 16)
      throw Error(errc::invalid_argument, {.file = slot.file, .tensor = spec.key},
                  fmt::format("a uint16 view needs a 16-bit dtype, not {}", dtype_name(slot.dtype)));
    if (spec.view_shape && checked_element_count(*spec.view_shape) != checked_element_count(slot.shape))
      throw Error(errc::invalid_argument, {.file = slot.file, .tensor = spec.key},
                  fmt::format("a view of shape {} does not have the elements of {}", format_shape(*spec.view_shape),
                              format_shape(slot.shape)));
    (void)exported_shape(slot.dtype, spec.view, spec.view_shape ? *spec.view_shape : slot.shape, spec.numpy,
                         {.file = slot.file, .tensor = spec.key});
  };
  return TensorSet{TensorSetModule{app::TensorSetModule::build(catalog, requests, viewable),
                                   std::make_shared<const std::vector<ReadSpec>>(specs)}};
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
  tensors.reserve(module.set.size());
  for (const app::TensorSetModule::Slot& s : module.set.slots()) tensors.push_back(s.parameter.value);
  return export_tensors(tensors, *module.specs);
}

pybind11::list export_keys(const TensorSetModule& module) {
  pybind11::list out;
  for (const ReadSpec& s : *module.specs) out.append(text_str(s.key));
  return out;
}

}  // namespace eredu::python
