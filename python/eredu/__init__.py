"""eredu for numpy and torch users: checkpoint loading through eredu's C++ engine.

    import eredu
    with eredu.safe_open("model.safetensors", framework="pt") as f:   # safetensors' API
        w = f.get_tensor("lm_head.weight")
    state_dict = eredu.load_file("model/", framework="pt")             # the whole checkpoint
    state_dict = await eredu.aload("model/", framework="np")           # asyncio
    for unit in eredu.prefetch("model/", lookahead=2): ...            # layer by layer
    slot = eredu.ModelSlot("v1/"); await slot.swap("v2/")              # hot-swap
    slot = eredu.InPlaceModelSlot("v1/"); await slot.patch("v2/")      # one copy, changed bytes written
    slot.swap_sync(eredu.Subscriber(group).open("step-9"))            # live update from a trainer

Tensors arrive zero-copy through DLPack and own their storage. eredu works on its own event-loop
thread with the GIL released; Ctrl-C cancels a blocking load cleanly. See docs/python.md.
"""

import atexit as _atexit

from . import _native
from ._errors import (AccessDeniedError, BackendError, BudgetError, CancelledError, CanaryError, ChecksumError, CollectiveError,
                      DeclarationError,
                      Error, FormatError, InvalidArgumentError, IoError, OrchestrationError, OutOfMemoryError,
                      RecipeError, RemoteError, RemoteNotFoundError, RemoteTimeoutError, ResourceExhaustedError, SafetensorError, SelectionError, SharedTensorsError, StoreError,
                      SwapInProgressError, TensorNotFoundError, UnsupportedDTypeError, _from_native)
from ._live import LiveGroup, Publication, Publisher, Subscriber
from ._loading import aload, aread, load_file
from ._in_place_slot import InPlaceModelSlot
from ._model_slot import ModelSlot, Version
from ._prefetch import Unit, prefetch
from ._safe_open import Slice, TensorInfo, safe_open
from ._serialize import TensorSpec, _safe_open_handle, deserialize, serialize, serialize_file

__version__ = _native.__version__

_native._set_error_factory(_from_native)
# eredu's log lines become records of logging.getLogger("eredu") (queued by eredu's threads,
# emitted from Python's: python/src/log_forwarding.hpp says why).
_native._install_logging()
# Stop handing completions to Python while the interpreter can still run this: afterwards no
# eredu thread takes the GIL.
_atexit.register(_native._shutdown)


def storage_stats():
    """Counters of the tensor storage shared by safe_open, load_file and aload: live_bytes (held by
    tensors), retained_bytes (freed, kept for reuse), fresh_allocations, recycled_allocations."""
    return _native.storage_stats()


def set_storage_retention(nbytes):
    """Keep up to `nbytes` of freed tensor storage for later loads (default 0: freed storage goes
    back to the system at once). Repeated loads of the same shapes then skip populating fresh
    memory; the memory stays in the process until trim_storage()."""
    from ._options import parse_size
    _native.set_storage_retention(parse_size("nbytes", nbytes, optional=False))


def trim_storage(keep=0):
    """Returns retained storage beyond `keep` bytes to the system."""
    from ._options import parse_size
    _native.trim_storage(parse_size("keep", keep, optional=False))


def write_checksums(path, digest="sha256", *, tensor_parallel=None, heads=None, kv_heads=None, head_dim=None,
                    family="llama", shard=()):
    """Writes the checkpoint's checksum sidecar, as `eredu checksum PATH --digest DIGEST` does: reads
    every tensor once and records its digest in <file>.sha256.json (checksums.sha256.json inside a
    directory), which loads (verify=) and ModelSlot swaps check. The digests already recorded (the
    checkpoint's metadata, the existing sidecar) are checked in the same pass and kept: one that
    differs from the file raises ChecksumError and nothing is written. The sidecar is replaced
    atomically. `digest` is "sha256" (interoperable), "xxh3-128" (a fast non-cryptographic check) or
    "both".

    With `tensor_parallel=N` it also records the digest of every shard each rank of an N-rank
    tensor-parallel group reads, as `eredu checksum --tensor-parallel N` does, by the same rules
    (eredu::app's sharding presets): the `shard` rules ("PATTERN=SPEC" strings, first match wins),
    then those of `family` ("llama", or "moe": experts divided as the dense MLP), with the attention
    heads from `heads`, `kv_heads`, `head_dim` or, for a checkpoint `eredu gen` wrote, its own dims.
    Returns {"sidecar", "tensors", "bytes", "digests", "verified", "shard_verified", "shards",
    "tensor_parallel"} (the last None, or {"ranks", "head_dim", "heads", "kv_heads", "dims_from",
    "split_tensors", "shards"})."""
    from ._options import invalid, os_path, parse_count
    if not isinstance(digest, str):
        raise invalid(f"digest must be 'sha256', 'xxh3-128' or 'both', not {digest!r}")
    given = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
    if tensor_parallel is None:
        extra = [k for k, v in given.items() if v is not None] + (["family"] if family != "llama" else []) + (
            ["shard"] if shard else [])
        if extra:
            raise invalid(f"{extra[0]}: only with tensor_parallel")
    if not isinstance(family, str):
        raise invalid(f"family must be 'llama' or 'moe', not {family!r}")
    try:
        rules = None if isinstance(shard, (str, bytes)) else list(shard)
    except TypeError:
        rules = None
    if rules is None or not all(isinstance(rule, str) for rule in rules):
        raise invalid(f"shard must be a sequence of 'PATTERN=SPEC' strings, not {shard!r}")
    return _native.write_checksums(os_path(path), digest, parse_count("tensor_parallel", tensor_parallel) or 0,
                                   *(parse_count(k, v) or 0 for k, v in given.items()), family, rules)


__all__ = [
    "__version__", "safe_open", "Slice", "TensorInfo", "load_file", "aload", "aread", "prefetch", "Unit",
    "ModelSlot", "InPlaceModelSlot", "Version", "storage_stats", "set_storage_retention", "trim_storage",
    "write_checksums", "TensorSpec", "serialize", "serialize_file", "deserialize",
    "Error", "SafetensorError", "SharedTensorsError", "FormatError", "StoreError", "IoError", "TensorNotFoundError", "SelectionError", "BudgetError",
    "ChecksumError", "RecipeError", "DeclarationError", "OrchestrationError", "CanaryError", "SwapInProgressError",
    "BackendError", "CollectiveError", "OutOfMemoryError", "ResourceExhaustedError", "InvalidArgumentError", "UnsupportedDTypeError", "CancelledError",
    "RemoteError", "AccessDeniedError", "RemoteNotFoundError", "RemoteTimeoutError",
    "LiveGroup", "Publisher", "Publication", "Subscriber",
]
