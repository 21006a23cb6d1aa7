"""Dtype rules: how each checkpoint dtype reaches numpy and torch.

For every tensor, `plan_tensor` decides before anything is read:

* the cast eredu runs on load, if any (`dtype=`: float tensors that eredu can convert, that is
  F16/BF16/F32 and F8_E4M3/F8_E5M2/F8_E8M0 to F32 or BF16, and F16/BF16/F32 among themselves;
  integer and bool tensors keep their dtype);
* the view the extension exports through DLPack: the stored type, BF16 bits as uint16, or raw
  bytes;
* a zero-copy `.view()` applied afterwards (bool, torch's float8 types).

numpy has no bfloat16. With numpy, BF16 tensors come as **uint16 arrays of the bf16 bits** by
default (`bf16="uint16"`: the same bytes, what `ml_dtypes`/`jax` users reinterpret), or converted to
float32 with `bf16="float32"`. torch gets `torch.bfloat16`.

Types a framework cannot hold — F8_*, F4, F6_* everywhere (torch ≥ 2.1 holds F8_E4M3/F8_E5M2 as its
float8 types), U16/U32/U64 in torch < 2.3 — raise UnsupportedDTypeError before the load, unless
`unsupported="raw"` asks for their bytes: a uint8 array whose last dimension is widened by the
element size (a flat array of the bytes for F4/F6 and for scalars; for GGUF's quantized block types
each row becomes its blocks' bytes, a Q4_K row of 512 values 288 bytes). Nothing is ever
reinterpreted silently.
"""

from . import _native
from ._errors import python_error

_BITS = {name: _native.dtype_bits(name) for name in _native.dtype_names()}
_HAS_DLPACK = {name: _native.has_dlpack_type(name) for name in _native.dtype_names()}

# torch dtypes newer than 1.13, used when present (checked by name, never assumed).
_TORCH_OPTIONAL = {"U16": "uint16", "U32": "uint32", "U64": "uint64"}
_TORCH_FLOAT8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
                 "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"}

_torch = None


def torch_module():
    global _torch
    if _torch is None:
        try:
            import torch
            import torch.utils.dlpack  # noqa: F401
        except ImportError as e:
            raise python_error("invalid_argument", f"framework='pt' needs torch, which cannot be imported ({e})") from e
        _torch = torch
    return _torch


def dtype_bits(dtype):
    return _BITS[dtype]


class TensorPlan:
    """What to ask the extension for, and what to do with what it returns."""

    __slots__ = ("cast", "view", "post")

    def __init__(self, cast, view, post):
        self.cast = cast  # eredu dtype to convert to on load, or None
        self.view = view  # "stored", "uint16" or "raw"
        self.post = post  # None, "bool" or a torch dtype name to .view() as


def _unsupported(name, dtype, fw, file):
    who = "numpy" if fw == "np" else "this torch"
    casts = [t for t in ("F32", "BF16") if _native.supported_cast(dtype, t)]
    hint = "pass unsupported='raw' for its bytes as uint8"
    if casts:
        hint += ", or dtype='float32' to convert it"
    return python_error("unsupported_dtype", f"{dtype} tensors cannot be held by {who}: {hint}", file=file,
                        tensor=name)


def plan_tensor(name, dtype, fw, *, cast=None, bf16="uint16", unsupported="error", file=None, shape=None):
    """The TensorPlan of tensor `name` stored as `dtype` for framework `fw` ("np" or "pt");
    `shape`: the tensor's, when it is read whole (F4 reaches torch >= 2.8 whole only)."""
    out = dtype
    conversion = None
    if cast is not None and cast != dtype and _native.supported_cast(dtype, cast):
        conversion, out = cast, cast
    if fw == "np" and out == "BF16":
        if bf16 == "float32":
            return TensorPlan("F32", "stored", None)
        return TensorPlan(conversion, "uint16", None)
    if out == "BOOL":
        return TensorPlan(conversion, "stored", "bool")
    if _HAS_DLPACK[out]:
        if fw == "np" or out not in _TORCH_OPTIONAL or hasattr(torch_module(), _TORCH_OPTIONAL[out]):
            return TensorPlan(conversion, "stored", None)
    elif fw == "pt" and out in _TORCH_FLOAT8 and hasattr(torch_module(), _TORCH_FLOAT8[out]):
        return TensorPlan(conversion, "raw", _TORCH_FLOAT8[out])
    elif (fw == "pt" and out == "F4" and shape and shape[-1] % 2 == 0
          and hasattr(torch_module(), "float4_e2m1fn_x2")):
        # torch's float4_e2m1fn_x2 holds two F4 values per element: the last dimension halves.
        return TensorPlan(conversion, "raw", ("float4_e2m1fn_x2", tuple(shape[:-1]) + (shape[-1] // 2,)))
    if unsupported == "raw":
        return TensorPlan(conversion, "raw", None)
    raise _unsupported(name, out, fw, file)


def to_framework(tensor, fw, post=None):
    """A numpy array or torch tensor sharing the exported tensor's storage (no copy)."""
    if fw == "np":
        import numpy as np
        array = np.from_dlpack(tensor)
        if getattr(tensor, "mapped", False):
            # DLPack 0.6 cannot mark bytes read-only: a write to a mapped weight must raise here,
            # not SIGSEGV. (torch, which has no read-only tensors, gets private copy-on-write mappings.)
            array.flags.writeable = False
        if post == "bool":
            array = array.view(np.bool_)
        return array
    torch = torch_module()
    t = torch.utils.dlpack.from_dlpack(tensor)
    if post == "bool":
        t = t.view(torch.bool)
    elif isinstance(post, tuple):  # (dtype name, shape): packed elements
        t = t.view(getattr(torch, post[0])).reshape(post[1])
    elif post is not None:
        t = t.view(getattr(torch, post))
    return t
