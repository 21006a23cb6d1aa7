#include "dlpack_tensor.hpp"

#include <pybind11/stl.h>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "eredu/core/error.hpp"
#include "eredu/core/shape.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

constexpr const char* capsule_name = "dltensor";
constexpr const char* used_capsule_name = "used_dltensor";

/// What a capsule owns until its consumer frees it: the DLManagedTensor and what it points to.
struct Exported {
  DLManagedTensor managed{};
  std::shared_ptr<cpu::StorageBlock> storage;  // keeps the bytes (and their pool) alive
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
};

void delete_exported(DLManagedTensor* self) {
  // Runs on the consumer's thread, GIL or not: it only drops the storage reference.
  std::unique_ptr<Exported> owned(static_cast<Exported*>(self->manager_ctx));
}

void destroy_capsule(PyObject* capsule) {
  // A capsule its consumer took is renamed "used_dltensor" and belongs to the consumer; one
  // never consumed still owns its tensor. The error indicator is kept, as a destructor may run
  // while an exception is being raised.
  if (PyCapsule_IsValid(capsule, used_capsule_name)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, capsule_name)))
    managed->deleter(managed);
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
}

std::optional<DLDataType> dlpack_type(DType t) noexcept {
  auto type = [](DLDataTypeCode code, unsigned bits) {
    return DLDataType{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
  };
  switch (t) {
    case DType::BOOL:
    case DType::U8:
      return type(kDLUInt, 8);
    case DType::I8:
      return type(kDLInt, 8);
    case DType::I16:
      return type(kDLInt, 16);
    case DType::U16:
      return type(kDLUInt, 16);
    case DType::F16:
      return type(kDLFloat, 16);
    case DType::BF16:
      return type(kDLBfloat, 16);
    case DType::I32:
      return type(kDLInt, 32);
    case DType::U32:
      return type(kDLUInt, 32);
    case DType::F32:
      return type(kDLFloat, 32);
    case DType::C64:
      return type(kDLComplex, 64);
    case DType::F64:
      return type(kDLFloat, 64);
    case DType::I64:
      return type(kDLInt, 64);
    case DType::U64:
      return type(kDLUInt, 64);
    default:
      return std::nullopt;  // F8_*, F4, F6_*: no DLPack type
  }
}

// Address given to consumers for tensors without bytes: some refuse a null data pointer.
alignas(64) std::byte empty_storage[64];

}  // namespace

TensorView tensor_view_from_name(const std::string& name) {
  if (name == "stored") return TensorView::stored;
  if (name == "uint16") return TensorView::uint16;
  if (name == "raw") return TensorView::raw;
  throw Error(errc::invalid_argument, {}, fmt::format("unknown tensor view '{}' (stored, uint16 or raw)", name));
}

const char* tensor_view_name(TensorView view) noexcept {
  switch (view) {
    case TensorView::stored:
      return "stored";
    case TensorView::uint16:
      return "uint16";
    case TensorView::raw:
      return "raw";
  }
  return "?";
}

bool has_dlpack_type(DType dtype) noexcept { return dlpack_type(dtype).has_value(); }

namespace {

constexpr std::uint64_t int64_max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

/// Bytes of one element as the consumer types it.
std::uint64_t item_bytes(DType dtype, TensorView view) noexcept {
  switch (view) {
    case TensorView::stored:
      return std::max(1u, dtype_bits(dtype) / 8);
    case TensorView::uint16:
      return 2;
    case TensorView::raw:
      return 1;
  }
  return 1;
}

Error overflow(const ErrorContext& context, const Shape& shape, const std::string& why) {
  return Error(errc::size_overflow, context, fmt::format("a tensor of shape {} {}", format_shape(shape), why));
}

/// `a * b`, or an overflow error naming `shape`.
std::uint64_t times(std::uint64_t a, std::uint64_t b, const ErrorContext& context, const Shape& shape) {
  std::uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw overflow(context, shape, "has raw bytes whose count overflows 64 bits");
  return out;
}

/// The u64 shape of the view: the raw view widens the last dimension (see file comment).
Shape view_shape(DType dtype, TensorView view, Shape s, const ErrorContext& context) {
  if (view != TensorView::raw) return s;
  const unsigned bits = dtype_bits(dtype);
  if (dtype_is_quantized(dtype) && !s.empty()) {
    // Block types (GGUF's quantized tensors): each row becomes its blocks' bytes, as a GGUF row
    // is stored (the catalog checked that rows are whole blocks).
    const StorageUnits units = storage_units(s, dtype);
    Shape out = units.shape;
    out.back() = times(out.back(), units.unit_bytes, context, s);
    return out;
  }
  if (bits == 8) return s;  // byte-sized already: the same shape
  if (bits % 8 != 0 || s.empty()) {
    const auto elements = checked_element_count(s);
    const auto bytes = elements ? checked_byte_size(*elements, dtype) : std::nullopt;
    if (!bytes) throw overflow(context, s, "has a byte count that overflows 64 bits");
    return Shape{*bytes};
  }
  const Shape original = s;
  s.back() = times(s.back(), bits / 8, context, original);
  return s;
}

}  // namespace

std::vector<std::int64_t> exported_shape(DType dtype, TensorView view, const Shape& shape, bool numpy,
                                         const ErrorContext& context) {
  const Shape s = view_shape(dtype, view, shape, context);
  std::vector<std::int64_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] > int64_max)
      throw overflow(context, shape,
                     fmt::format("cannot be handed to numpy or torch: dimension {} of its view ({}) exceeds 2^63-1, "
                                 "the largest their int64 dimensions hold",
                                 i, s[i]));
    out.push_back(static_cast<std::int64_t>(s[i]));
  }
  if (numpy) {
    std::uint64_t bytes = item_bytes(dtype, view);
    for (std::uint64_t d : s)
      if (d != 0 && (__builtin_mul_overflow(bytes, d, &bytes) || bytes > int64_max))
        throw overflow(context, shape,
                       fmt::format("cannot be a numpy array: numpy multiplies its dimensions other than 0 and the "
                                   "item size ({} bytes) in int64, even for an empty array, and they exceed 2^63-1 "
                                   "(torch holds it: framework='pt')",
                                   item_bytes(dtype, view)));
  }
  return out;
}

DLPackTensor::DLPackTensor(cpu::Tensor tensor, TensorView view, std::optional<Shape> shape, const std::string& name)
    : tensor_(std::move(tensor)), view_(view) {
  const DType dtype = tensor_.dtype();
  const Shape s = shape ? std::move(*shape) : tensor_.shape();
  if (checked_element_count(s) != checked_element_count(tensor_.shape()))
    throw Error(errc::invalid_argument, {.tensor = name},
                fmt::format("a view of shape {} does not have the {} elements of {}", format_shape(s),
                            tensor_.elements(), format_shape(tensor_.shape())));
  switch (view) {
    case TensorView::stored: {
      auto t = dlpack_type(dtype);
      if (!t)
        throw Error(errc::invalid_argument, {.tensor = name},
                    fmt::format("{} has no DLPack type: ask for its raw bytes", dtype_name(dtype)));
      type_ = *t;
      break;
    }
    case TensorView::uint16:
      if (dtype_bits(dtype) != 16)
        throw Error(errc::invalid_argument, {.tensor = name},
                    fmt::format("a uint16 view needs a 16-bit dtype, not {}", dtype_name(dtype)));
      type_ = DLDataType{kDLUInt, 16, 1};
      break;
    case TensorView::raw:
      type_ = DLDataType{kDLUInt, 8, 1};
      break;
  }
  shape_ = exported_shape(dtype, view, s, false, {.tensor = name});
}

std::uintptr_t DLPackTensor::data_ptr() const noexcept {
  return tensor_.nbytes() ? reinterpret_cast<std::uintptr_t>(tensor_.bytes().data())
                          : reinterpret_cast<std::uintptr_t>(empty_storage);
}

py::capsule DLPackTensor::capsule() const {
  auto exported = std::make_unique<Exported>();
  exported->storage = tensor_.storage();
  exported->shape = shape_;
  // Row-major element strides, spelled out: consumers differ in how they read a null pointer.
  // Only a tensor without elements can have strides past int64 (exported_shape bounds each
  // dimension, and a non-empty tensor's bytes its file): it gets 1s, as any stride addresses
  // none of its elements.
  exported->strides.assign(shape_.size(), 1);
  for (std::size_t i = shape_.size(); i-- > 1;) {
    if (__builtin_mul_overflow(exported->strides[i], shape_[i], &exported->strides[i - 1])) {
      exported->strides.assign(shape_.size(), 1);
      break;
    }
  }
  DLTensor& t = exported->managed.dl_tensor;
  t.data = reinterpret_cast<void*>(data_ptr());
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int>(shape_.size());
  t.dtype = type_;
  t.shape = exported->shape.data();
  t.strides = exported->strides.data();
  t.byte_offset = 0;
  exported->managed.manager_ctx = exported.get();
  exported->managed.deleter = delete_exported;
  PyObject* capsule = PyCapsule_New(&exported->managed, capsule_name, destroy_capsule);
  if (!capsule) throw py::error_already_set();
  (void)exported.release();  // the capsule owns it now: destroy_capsule or the consumer frees it
  return py::reinterpret_steal<py::capsule>(capsule);
}

void bind_dlpack_tensor(py::module_& m) {
  py::class_<DLPackTensor>(m, "Tensor",
                           "A loaded tensor as a DLPack producer (np.from_dlpack, torch.utils.dlpack.from_dlpack); "
                           "holds the storage, shares it with every consumer.")
      .def(
          "__dlpack__", [](const DLPackTensor& t, const py::object& /*stream*/) { return t.capsule(); },
          py::arg("stream") = py::none(), "A new 'dltensor' capsule sharing this tensor's storage (CPU: no stream).")
      .def(
          "__dlpack_device__", [](const DLPackTensor&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); },
          "(kDLCPU, 0): the bytes are in host memory.")
      .def_property_readonly(
          "shape", [](const DLPackTensor& t) { return py::tuple(py::cast(t.shape())); }, "The view's shape.")
      .def_property_readonly(
          "dtype", [](const DLPackTensor& t) { return std::string(dtype_name(t.dtype())); },
          "The checkpoint dtype of the bytes (safetensors spelling).")
      .def_property_readonly(
          "view", [](const DLPackTensor& t) { return tensor_view_name(t.view()); }, "stored, uint16 or raw.")
      .def_property_readonly("nbytes", &DLPackTensor::nbytes, "Bytes of data.")
      .def_property_readonly("data_ptr", &DLPackTensor::data_ptr, "Address of the first byte.")
      .def_property_readonly("mapped", &DLPackTensor::mapped,
                             "True when the bytes are the checkpoint's page-cache pages, mapped read-only "
                             "(weights='map'): a write to them would kill the process.");
}

}  // namespace eredu::python
