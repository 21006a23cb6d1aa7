"""Writing safetensors files as Hugging Face's writer lays them out, byte for byte: tensors
ordered by dtype (largest first, in safetensors' own dtype order) then by name, the header in
compact JSON with `__metadata__` first, non-ASCII written as UTF-8, padded with spaces to a
multiple of 8 bytes. python/tests/data/safetensors_reference holds that writer's own output,
which the tests reproduce. The one freedom: safetensors orders the metadata's keys as its hash
map happens to, so they are written here in the caller's order.

Reading bytes back (`load`) goes through eredu's own parser, so a bad buffer gets the same
typed errors as a bad file."""

import json
import os
import tempfile

import numpy as np

from ._errors import InvalidArgumentError, SharedTensorsError

# safetensors' Dtype enum, in its declaration order: the writer sorts tensors by it, largest first.
_DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
                "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
_RANK = {name: i for i, name in enumerate(_DTYPE_ORDER)}

_NP_DTYPE = {np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
             np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16", np.dtype(np.float16): "F16",
             np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32", np.dtype(np.float32): "F32",
             np.dtype(np.float64): "F64", np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64",
             np.dtype(np.complex64): "C64"}


def _check_metadata(metadata):
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise InvalidArgumentError("metadata must be a dict of str to str", kind="invalid_argument")
    return metadata


def layout(entries, metadata=None):
    """The file's parts in order, the header first, then each tensor's bytes as given (no copy),
    for `entries`, a list of (name, dtype name, shape, raw little-endian bytes: any buffer whose
    len() is its byte count)."""
    metadata = _check_metadata(metadata)
    names = set()
    for name, _, _, _ in entries:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"a tensor name must be a str, not {type(name).__name__}",
                                       kind="invalid_argument")
        if name == "__metadata__" or name in names:
            raise InvalidArgumentError(f"tensor name {name!r} is reserved or repeated", kind="invalid_argument")
        names.add(name)
    ordered = sorted(entries, key=lambda e: (-_RANK[e[1]], e[0]))
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in ordered:
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text] + [e[3] for e in ordered]


def serialize(entries, metadata=None):
    """The file's bytes for `entries` (see layout)."""
    return b"".join(layout(entries, metadata))


def numpy_entries(tensors):
    """(name, dtype, shape, bytes) of each numpy array of `tensors`, as safetensors.numpy takes them."""
    if not isinstance(tensors, dict):
        raise InvalidArgumentError("tensors must be a dict of name to numpy array", kind="invalid_argument")
    entries = []
    for name, array in tensors.items():
        if not isinstance(array, np.ndarray):
            raise InvalidArgumentError(f"tensor {name!r} is a {type(array).__name__}, not a numpy array",
                                       kind="invalid_argument")
        dtype = _NP_DTYPE.get(array.dtype.newbyteorder("="))
        if dtype is None:
            raise InvalidArgumentError(f"tensor {name!r}: numpy dtype {array.dtype} has no safetensors dtype",
                                       kind="invalid_argument")
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        # A uint8 view of the array's own memory where it is already contiguous little-endian:
        # writing it is the only copy.
        entries.append((name, dtype, array.shape, np.ascontiguousarray(little).reshape(-1).view(np.uint8)))
    return entries


def write_file(parts, filename):
    """Writes `parts` (layout's) to `filename` one after the other, whole or not at all: into a
    temporary file beside it, renamed over it once complete, so a failure or a reader never sees
    half a checkpoint. Nothing is joined in memory first."""
    path = os.fspath(filename)
    directory = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".eredu-save-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_bytes(data, loader):
    """`loader(path)` of a safetensors file held in `data` (bytes-like), through an anonymous
    in-memory file: eredu's parser and its typed errors, no file on disk."""
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidArgumentError(f"load takes bytes, not {type(data).__name__}", kind="invalid_argument") from None
    fd = os.memfd_create("eredu-load", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(view)
        return loader(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


# torch dtype names (str(torch.dtype) without "torch.") and safetensors', for the types a given
# torch has: torch 1.13 has no float8 nor uint16/32/64.
_TORCH_DTYPE = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
                "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32", "float64": "F64",
                "int64": "I64", "uint64": "U64", "complex64": "C64", "float8_e4m3fn": "F8_E4M3",
                "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "float8_e4m3fnuz": "F8_E4M3FNUZ",
                "float8_e5m2fnuz": "F8_E5M2FNUZ", "float4_e2m1fn_x2": "F4"}


def _storage_span(t):
    """(storage address, first byte, end byte) of a tensor's bytes, to find tensors that share memory."""
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    start = t.data_ptr()
    return storage.data_ptr(), start, start + t.numel() * t.element_size()


def torch_entries(tensors, keep=None):
    """(name, dtype, shape, bytes) of each torch tensor of `tensors`, refusing what
    safetensors.torch refuses: non-tensors, sparse and non-contiguous tensors, and tensors that
    share memory (writing both would duplicate it, and loading them back would untie them).
    A tensor on a device (CUDA) is copied to the host. With `keep` "device" such a tensor, with
    "all" every tensor with elements, is given as itself (detached) in place of its bytes."""
    from ._frameworks import torch_module
    torch = torch_module()
    # The call's errors in safetensors.torch's words (ValueError, RuntimeError for shared memory),
    # so code matching them keeps working.
    if not isinstance(tensors, dict):
        raise InvalidArgumentError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}",
                                   kind="invalid_argument")
    entries, spans = [], []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}",
                                       kind="invalid_argument")
    sparse = [name for name, t in tensors.items() if t.layout != torch.strided]
    if sparse:
        raise InvalidArgumentError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support. You can make "
            "it a dense tensor before saving with `.to_dense()` but be aware this might make a much larger file than "
            "needed.", kind="invalid_argument")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise InvalidArgumentError(f"tensor {name!r} is not contiguous: save a .contiguous() copy",
                                       kind="invalid_argument")
        dtype = _TORCH_DTYPE.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise InvalidArgumentError(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors dtype",
                                       kind="invalid_argument")
        t = t.detach()
        as_is = t.numel() > 0 and (keep == "all" or (keep == "device" and t.device.type != "cpu"))
        if not as_is:
            t = t.cpu()
        if t.numel():
            spans.append(((str(t.device), *_storage_span(t)), name))
        if as_is:
            raw = t
        else:
            raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""  # a view: no copy
        shape = tuple(t.shape)
        if dtype == "F4" and shape:  # torch's element holds two F4 values: the file counts values
            shape = shape[:-1] + (shape[-1] * 2,)
        entries.append((name, dtype, shape, raw))
    spans.sort()
    for ((device_a, storage_a, _, end_a), a), ((device_b, storage_b, start_b, _), b) in zip(spans, spans[1:]):
        if (device_a, storage_a) == (device_b, storage_b) and start_b < end_a:
            raise SharedTensorsError(
                f"tensors {a!r} and {b!r} share memory: saving both would write it twice and load them "
                "back untied; save one of them, or the model with save_model (safetensors.torch raises here "
                "too)", kind="invalid_argument")
    return entries
