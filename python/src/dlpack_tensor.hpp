#pragma once
/// \file
/// eredu::python::DLPackTensor: a loaded CPU tensor as a DLPack producer — what numpy's
/// `np.from_dlpack` and torch's `torch.utils.dlpack.from_dlpack` take (`__dlpack__`,
/// `__dlpack_device__`, the legacy "dltensor" capsule of DLPack 0.6).
///
/// No copy: the capsule's DLManagedTensor holds a reference to the tensor's storage block,
/// released by its deleter when the consumer's array or tensor is freed (on any thread, with or
/// without the GIL: it touches no Python object). So an array stays valid after its safe_open
/// is closed, its pipeline unit released or its slot version retired.
///
/// A tensor is exported under one of three views, chosen per tensor by the Python layer's
/// dtype rules (eredu/_frameworks.py), never guessed here:
///  * stored: the checkpoint's element type as DLPack spells it (BOOL as 8-bit unsigned, which
///    the Python layer views as bool); F8, F4 and F6 have no DLPack type and are refused;
///  * uint16: a 16-bit type's bits as unsigned 16-bit integers (numpy's view of BF16);
///  * raw: unsigned bytes, the last dimension widened by the element size (the same shape for
///    8-bit types; a flat array of the tensor's bytes for sub-byte types and for scalars wider
///    than a byte) — for types a framework cannot hold, on request only.

#include <pybind11/pybind11.h>

#include <dlpack/dlpack.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/cpu/tensor.hpp"

namespace eredu::python {

/// How a tensor's bytes are typed for the consumer (see file comment).
enum class TensorView {
  stored,  ///< the checkpoint's element type
  uint16,  ///< a 16-bit type's bits as uint16
  raw,     ///< uint8 bytes
};

/// Parses "stored", "uint16" or "raw"; throws Error(invalid_argument) for anything else.
TensorView tensor_view_from_name(const std::string& name);
/// The name of a view.
const char* tensor_view_name(TensorView view) noexcept;

/// True when `dtype` has a DLPack type of its own (the stored view is possible).
bool has_dlpack_type(DType dtype) noexcept;

/// The dimensions a consumer sees of a `dtype` tensor of `shape` under `view` (see file comment),
/// as DLPack's int64. A valid safetensors shape may not fit: dimensions are u64 there, and a
/// tensor with a zero dimension holds no bytes whatever the others are. Throws
/// Error(size_overflow) with `context` when a dimension exceeds 2^63-1 (numpy, torch and DLPack
/// count in int64), or, where `numpy`, when numpy could not make the array: it multiplies the
/// dimensions other than 0, and the item size, in int64, even for an empty array.
std::vector<std::int64_t> exported_shape(DType dtype, TensorView view, const Shape& shape, bool numpy,
                                         const ErrorContext& context);

/// One exported tensor (see file comment). Cheap to copy: copies share the storage.
class DLPackTensor {
 public:
  /// `tensor` seen through `view`, with `shape` (the same element count: a selection with
  /// integer indices drops those dimensions) or the tensor's own shape. Throws
  /// Error(invalid_argument) naming `name` when the view does not fit the dtype or the shape.
  DLPackTensor(cpu::Tensor tensor, TensorView view, std::optional<Shape> shape, const std::string& name);

  /// A new "dltensor" capsule sharing the storage (`__dlpack__`).
  pybind11::capsule capsule() const;
  /// The view's shape.
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// The checkpoint dtype of the bytes ("BF16").
  DType dtype() const noexcept { return tensor_.dtype(); }
  /// The view.
  TensorView view() const noexcept { return view_; }
  /// Bytes of data.
  std::size_t nbytes() const noexcept { return tensor_.nbytes(); }
  /// Address of the first byte (for tests of zero-copy).
  std::uintptr_t data_ptr() const noexcept;
  /// The tensor itself.
  const cpu::Tensor& tensor() const noexcept { return tensor_; }
  /// True when the bytes are a read-only mapping of the checkpoint (weights="map"): DLPack
  /// 0.6 cannot say so, so the Python layer marks the consumer's array read-only itself. A
  /// private copy-on-write mapping (weights="map-private") is writable: false.
  bool mapped() const noexcept { return tensor_ && tensor_.storage()->read_only(); }

 private:
  cpu::Tensor tensor_;
  TensorView view_;
  DLDataType type_{};
  std::vector<std::int64_t> shape_;
};

/// Registers eredu._native.Tensor.
void bind_dlpack_tensor(pybind11::module_& m);

}  // namespace eredu::python
