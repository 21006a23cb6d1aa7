"""safetensors' low-level API (its main branch, 0.8): TensorSpec, serialize, serialize_file,
deserialize and _safe_open_handle, which safetensors.numpy/torch and their users build on.

A TensorSpec names raw memory (an address and a length), as safetensors' does: the caller keeps
that memory alive while serialize runs. Its bytes are written from where they lie (a view of the
address, no copy), with the layout and atomic file write of eredu's own writers (_writing)."""

import ctypes
import os

from ._errors import InvalidArgumentError
from ._writing import _DTYPE_ORDER, _TORCH_DTYPE, layout, load_bytes, serialize as _serialize_entries, write_file

# Constructor-style names (numpy's and torch's dtype names) of safetensors' format codes.
_BY_NAME = {**_TORCH_DTYPE, "float4_e2m1fn_x2": "F4", "float6_e2m3fn": "F6_E2M3", "float6_e3m2fn": "F6_E3M2"}
_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
         "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64, "F4": 4,
         "F6_E2M3": 6, "F6_E3M2": 6}


def _format_code(dtype):
    text = str(dtype).removeprefix("torch.")
    code = _BY_NAME.get(text) or (text if text in _DTYPE_ORDER else None)
    if code is None:
        raise InvalidArgumentError(f"TensorSpec: unknown dtype {dtype!r}", kind="invalid_argument")
    return code


class TensorSpec:
    """One tensor for serialize/serialize_file: its dtype (a numpy/torch name such as "float32",
    or a safetensors code such as "F32"), its shape, and the address and byte length of its
    contiguous little-endian bytes, which must stay alive until serialize returns."""

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype, shape, data_ptr, data_len):
        self._dtype = _format_code(dtype)
        shape = [int(d) for d in shape]
        if any(d < 0 for d in shape) or int(data_ptr) < 0 or int(data_len) < 0:
            raise InvalidArgumentError(f"TensorSpec: negative shape, address or length ({shape}, {data_ptr}, "
                                       f"{data_len})", kind="invalid_argument")
        if self._dtype == "F4" and shape:
            shape[-1] *= 2  # torch's storage shape holds two F4 values per element
        self._shape = shape
        self._data_ptr = int(data_ptr)
        self._data_len = int(data_len)
        elements = 1
        for d in shape:
            elements *= d
        if elements * _BITS[self._dtype] != self._data_len * 8:
            raise InvalidArgumentError(f"TensorSpec: {self._data_len} bytes do not hold shape {shape} of "
                                       f"{self._dtype}", kind="invalid_argument")

    dtype = property(lambda self: self._dtype, doc="The safetensors format code (\"F32\", \"BF16\", ...).")
    shape = property(lambda self: list(self._shape), doc="The logical shape written into the header.")
    data_ptr = property(lambda self: self._data_ptr, doc="The address of the tensor's bytes.")
    data_len = property(lambda self: self._data_len, doc="The byte length of the tensor's bytes.")

    def __repr__(self):
        return f"TensorSpec(dtype={self._dtype!r}, shape={self._shape}, data_len={self._data_len})"

    def _bytes(self):
        if self._data_len == 0:
            return b""
        return memoryview((ctypes.c_char * self._data_len).from_address(self._data_ptr)).cast("B")


def _entries(tensor_dict):
    if not isinstance(tensor_dict, dict):
        raise TypeError(f"serialize takes a dict of name to TensorSpec, not {type(tensor_dict).__name__}")
    entries = []
    for name, spec in tensor_dict.items():
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"tensor {name!r} is a {type(spec).__name__}, not a TensorSpec")
        entries.append((name, spec.dtype, spec.shape, spec._bytes()))
    return entries


def serialize(tensor_dict, metadata=None):
    """The bytes of a safetensors file holding `tensor_dict` ({name: TensorSpec}) and `metadata`."""
    return _serialize_entries(_entries(tensor_dict), metadata)


def serialize_file(tensor_dict, filename, metadata=None):
    """Writes serialize(tensor_dict, metadata) to `filename`, whole or not at all; the writes run
    without the GIL (each is one os-level write of the tensor's own memory)."""
    write_file(layout(_entries(tensor_dict), metadata), filename)


def deserialize(data):
    """[(name, {"dtype", "shape", "data"})] of the safetensors file held in `data`, in file order,
    parsed by eredu (its typed errors on a bad buffer); "data" is each tensor's bytes."""
    from ._safe_open import safe_open

    def read(path):
        with safe_open(path, "np", unsupported="raw") as f:
            infos = [f.tensor_info(n) for n in f.offset_keys()]
            tensors = f.load()
        return [(i.name, {"dtype": i.dtype, "shape": list(i.shape), "data": tensors[i.name].tobytes()}) for i in infos]

    return load_bytes(data, read)


def _safe_open_handle(handle, framework, device="cpu", **options):
    """safe_open of an open file object (its descriptor; a file object without one is read whole
    into memory first)."""
    from ._safe_open import safe_open
    try:
        fd = handle.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is not None:
        return safe_open(f"/proc/self/fd/{fd}", framework, device, **options)
    handle.seek(0)
    data = handle.read()
    memfd = os.memfd_create("eredu-handle", os.MFD_CLOEXEC)
    with os.fdopen(os.dup(memfd), "wb") as f:
        f.write(data)
    try:
        return safe_open(f"/proc/self/fd/{memfd}", framework, device, **options)
    finally:
        os.close(memfd)
