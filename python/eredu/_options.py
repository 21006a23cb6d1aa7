"""Keyword options, validated and normalised in one place.

Every public function that opens a checkpoint takes the same keywords; `open_options` turns them
into the dict the extension maps onto eredu's options structs (python/src/source_options.cpp).
An option added to the library is added here and there, nowhere else.

    budget          staging memory (bytes, or "64M"): the lease pool; default 64 MiB, less for a
                    smaller checkpoint. Loads that keep dtypes read straight into tensors and
                    stage nothing; casts of tensors not in the page cache stage in chunks.
    threads         threads that populate memory and convert (default: every hardware thread)
    depth, request  reads in flight and the largest read (default 8 and 8 MiB, as `eredu load`)
    reader          "auto" (io_uring, else pread), "uring" or "pread"
    direct          O_DIRECT for data not in the page cache: "auto", "on" or "off"
    chunk           largest chunk a cast reads at once
    map_resident    convert page-cache-resident tensors straight from a mapping (default True)
    weights         where tensors kept in their stored dtype live: "copy" (process memory, the
                    default), "map" (the checkpoint's page-cache pages, mapped: no copy; numpy
                    arrays come back read-only, torch tensors are mapped privately, as
                    "map-private"), "map-private" (mapped copy-on-write, MAP_PRIVATE as
                    torch.load(mmap=True) maps: writable, a written page becomes the process's own
                    copy and the file never changes) or "map-lock" (mapped read-only and pinned with
                    mlock, within RLIMIT_MEMLOCK; numpy only). Whole-checkpoint loads and safe_open
                    only. The trade-offs are in docs/python.md.
    backend         safetensors' `backend=`, "mmap" or "pread", as eredu can honour it
                    (backend_options): "mmap" is eredu's default reading, "pread" reads every
                    byte with pread(2) and maps nothing.

Integer options accept the ranges in RANGES (the `eredu` command's); a bool, a float or a value
outside its range raises InvalidArgumentError naming the option and the range. Paths are passed to
the extension as the OS's bytes (os_path).
"""

import operator
import os
import re

from . import _native
from ._errors import python_error

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_MIB = 1 << 20

OPEN_KEYS = ("budget", "threads", "depth", "request", "reader", "direct", "chunk", "map_resident", "copy_resident",
             "weights", "backend", "_faults",
             # A checkpoint behind a URL (docs/remote.md): the local cache, TLS, S3, ranged GETs.
             "cache", "cache_max", "ca_file", "s3_endpoint", "s3_region", "s3_addressing", "anonymous",
             "connections", "part_size")
BACKENDS = ("mmap", "pread")
WEIGHTS = ("copy", "map", "map-lock", "map-private")

# The accepted range of every integer option, inclusive. The shared ones (budget, staging,
# request, chunk, threads, depth, lookahead, passes) are the `eredu` command's own table
# (eredu::app's option_presets.hpp), so a value that works from the shell works from Python and
# the other way round. Sizes are bytes.
RANGES = {
    **_native.option_ranges(),
    "concurrent_loads": (1, 64),   # at most lookahead + 1 units load at once anyway
    "nbytes": (0, (1 << 64) - 1),  # set_storage_retention: a cap, kept in 64 bits
    "keep": (0, (1 << 64) - 1),    # trim_storage
    "readahead": (0, (1 << 64) - 1),  # safe_open: bytes get_tensor reads ahead (0: none)
    "patch_budget": (0, (1 << 64) - 1),  # InPlaceModelSlot.patch: the changed blocks it may hold
    # Remote checkpoints (io::RemoteOptions' ranges, validated again there).
    "cache_max": (0, 1 << 50),
    "part_size": (4096, 1 << 30),
    "connections": (1, 1024),
}


def invalid(detail, **where):
    return python_error("invalid_argument", detail, **where)


def _bytes_text(n):
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= unit and n % unit == 0:
            return f"{n} ({n // unit}{suffix})"
    return str(n)


def _range_text(name, size):
    low, high = RANGES[name]
    if size:
        return f"from {_bytes_text(low)} to {_bytes_text(high)} bytes"
    return f"from {low} to {high}"


def _is_bool(value):
    # numpy's bool_ is no int subclass, but operator.index accepted it in older numpy releases.
    return isinstance(value, bool) or type(value).__name__ == "bool_"


def parse_count(name, value):
    """`value` (an int, or anything with __index__ such as a numpy integer) within RANGES[name]; None
    stays None. Bools, floats and values out of range raise InvalidArgumentError naming the option and
    its range."""
    if value is None:
        return None
    try:
        if _is_bool(value):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise invalid(f"{name} must be an integer {_range_text(name, False)}, not {value!r}") from None
    low, high = RANGES[name]
    if not low <= n <= high:
        raise invalid(f"{name} must be {_range_text(name, False)}, not {n}")
    return n


def parse_size(name, value, *, optional=True):
    """Bytes from an int or a string such as "64M", "2GiB", "512k", within RANGES[name]; None stays
    None where `optional`. Anything else raises InvalidArgumentError naming the option and its range."""
    if value is None and optional:
        return None
    if isinstance(value, str):
        m = _SIZE.match(value)
        if not m:
            raise invalid(f"{name} must be a number of bytes such as 67108864 or '64M' "
                          f"({_range_text(name, True)}), not {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        try:
            if _is_bool(value):
                raise TypeError
            n = operator.index(value)
        except TypeError:
            raise invalid(f"{name} must be a number of bytes {_range_text(name, True)}, not {value!r}") from None
    low, high = RANGES[name]
    if not low <= n <= high:
        raise invalid(f"{name} must be {_range_text(name, True)}, not {value!r}")
    return n


def os_path(value, name="path"):
    """The OS's bytes of a path given as str (surrogate escapes included: what os.fsdecode makes of
    bytes that are not UTF-8), bytes or os.PathLike, as os.fsencode gives them. Paths cross into eredu
    as bytes, so any name the file system holds can be opened. Anything else, or a path holding a NUL
    byte (which no file name can), raises InvalidArgumentError."""
    try:
        raw = os.fsencode(value)
    except TypeError:
        raise invalid(f"{name} must be a str, bytes or os.PathLike, not {type(value).__name__}") from None
    except UnicodeEncodeError as e:  # a lone surrogate that no bytes decode to
        raise invalid(f"{name} {value!r} cannot be encoded as a file name ({e.reason})") from None
    if b"\0" in raw:
        raise invalid(f"{name} {os.fsdecode(raw)!r} contains a NUL byte, which no file name can")
    return raw


def _checkpoint_bytes(path):
    """Bytes of the checkpoint's files at `path` (the OS's bytes), or None when that cannot be told
    cheaply."""
    try:
        if os.path.isfile(path):
            if path.endswith(b".json"):
                path = os.path.dirname(path) or b"."
            else:
                return os.path.getsize(path)
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(b".safetensors") and e.is_file())
    except OSError:
        return None
    return None


def verify_mode(verify):
    """The extension's verification mode of a `verify` keyword: False 0 (off), None 1 (what the
    checkpoint records a digest of), True 2 (every tensor read, or the load fails)."""
    if verify is not None and not isinstance(verify, bool):  # 1 == True: refuse it, not guess
        raise invalid(f"verify must be None, False or True, not {verify!r}")
    return {None: 1, False: 0, True: 2}[verify]


def check_weights(options, fw, *, where=None):
    """Refuses a `weights` keyword that cannot be honoured: a value other than WEIGHTS, "map-lock" for
    torch (torch has no read-only tensors, so its mappings are private copy-on-write ones, which eredu
    does not lock), or any mapping where `where` (a class that only copies) names the caller. For
    torch, "map" becomes "map-private" in `options`: a write to a read-only mapping would kill the
    process with SIGSEGV, a write to a private one copies the page."""
    value = options.get("weights")
    if value is None or value == "copy":
        return
    if value not in WEIGHTS:
        raise invalid(f"weights must be 'copy', 'map', 'map-lock' or 'map-private', not {value!r}")
    if where is not None:
        raise invalid(f"weights={value!r}: {where} copies its tensors (mapped weights are offered by load_file, "
                      f"aload and safe_open)")
    if fw == "pt":
        if value == "map-lock":
            raise invalid("weights='map-lock' needs framework='np': torch's mapped weights (weights='map') are "
                          "private copy-on-write mappings, which eredu does not lock")
        options["weights"] = "map-private"


def backend_options(options):
    """eredu's options for safetensors' `backend=` keyword, or {} for none. safetensors serves
    bytes from a mapping of the file ("mmap", its default) or with pread(2) ("pread"); eredu has no
    mmap-only reader, so each is mapped onto what eredu does that matches it:

      "mmap"   eredu's default, unchanged: cold bytes are read by the reader (io_uring, else
               pread), page-cache-resident tensors may be copied or converted from a mapping of
               the file (map_resident); tensors are private copies, as safetensors' are (the
               zero-copy mapping is weights="map").
      "pread"  no mapping at all: reader="pread" and map_resident=False, so every byte arrives
               by pread(2) on eredu's reader threads; weights="map", map_resident=True or
               another reader contradict it and raise InvalidArgumentError.
    """
    backend = options.get("backend")
    if backend is None:
        return {}
    if backend not in BACKENDS:
        raise invalid(f"backend must be 'mmap' or 'pread', not {backend!r}")
    if backend == "mmap":
        return {}
    for key, fits in (("reader", lambda v: v == "pread"), ("map_resident", lambda v: v is False),
                      ("weights", lambda v: v == "copy")):
        value = options.get(key)
        if value is not None and not fits(value):
            raise invalid(f"backend='pread' reads every byte with pread(2) and maps nothing: {key}={value!r} "
                          f"contradicts it")
    return {"reader": "pread", "map_resident": False, "copy_resident": False}


def open_options(path, options, *, copy_resident=True):
    """The extension's option dict for opening `path` with the keywords `options`."""
    unknown = sorted(set(options) - set(OPEN_KEYS))
    if unknown:
        raise invalid(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                      f"(known: {', '.join(k for k in OPEN_KEYS if not k.startswith('_'))})")
    backend = backend_options(options)
    out = {"copy_resident": copy_resident}
    budget = parse_size("budget", options.get("budget"))
    if budget is None:
        # No point mapping (and, with io_uring, pinning) 64 MiB to read a small file.
        total = _checkpoint_bytes(os_path(path))
        budget = 64 * _MIB if total is None else min(64 * _MIB, max(_MIB, -(-total // _MIB) * _MIB))
    out["budget"] = budget
    out["threads"] = parse_count("threads", options.get("threads"))
    out["depth"] = parse_count("depth", options.get("depth"))
    out["request"] = parse_size("request", options.get("request"))
    out["chunk"] = parse_size("chunk", options.get("chunk"))
    for key, allowed in (("reader", ("auto", "uring", "pread")), ("direct", ("auto", "on", "off"))):
        v = options.get(key)
        if v is not None and v not in allowed:
            raise invalid(f"{key} must be {', '.join(allowed[:-1])} or {allowed[-1]}, not {v!r}")
        out[key] = v
    for key in ("map_resident", "copy_resident"):
        v = options.get(key)
        if v is not None:
            if not isinstance(v, bool):  # 0 and 1 == False and True: refuse them, not guess
                raise invalid(f"{key} must be True or False, not {v!r}")
            out[key] = v
    if options.get("weights") is not None:
        out["weights"] = options["weights"]  # check_weights validated it (every caller runs it first)
    if options.get("_faults") is not None:
        out["_faults"] = options["_faults"]
    for key in ("cache", "ca_file"):
        if options.get(key) is not None:
            out[key] = os_path(options[key], key)
    for key in ("s3_endpoint", "s3_region"):
        v = options.get(key)
        if v is not None:
            if not isinstance(v, str):
                raise invalid(f"{key} must be a str, not {type(v).__name__}")
            out[key] = v
    v = options.get("s3_addressing")
    if v is not None:
        if v not in ("auto", "path", "virtual"):
            raise invalid(f"s3_addressing must be auto, path or virtual, not {v!r}")
        out["s3_addressing"] = v
    v = options.get("anonymous")
    if v is not None:
        if not isinstance(v, bool):
            raise invalid(f"anonymous must be True or False, not {v!r}")
        out["anonymous"] = v
    if options.get("cache_max") is not None:
        out["cache_max"] = parse_size("cache_max", options["cache_max"])
    if options.get("part_size") is not None:
        out["part_size"] = parse_size("part_size", options["part_size"])
    out["connections"] = parse_count("connections", options.get("connections"))
    out.update(backend)
    return out


_FRAMEWORKS = {"np": "np", "numpy": "np", "pt": "pt", "torch": "pt", "pytorch": "pt"}


def framework(name):
    """ "np" or "pt" from the names safetensors accepts for numpy and torch."""
    fw = _FRAMEWORKS.get(name) if isinstance(name, str) else None
    if fw is None:
        raise invalid(f"framework must be 'np' (numpy) or 'pt' (torch), not {name!r}")
    return fw


def device(value, fw="np"):
    """The device tensors are delivered on: "cpu" (where eredu loads them), or for torch any
    device torch names (`"cuda:0"`, `0`, a torch.device), which the tensors are moved to once
    loaded, as safetensors moves them."""
    text = str(value)
    if text in ("cpu", "cpu:0"):
        return "cpu"
    if fw == "pt":
        from ._frameworks import torch_module
        torch = torch_module()
        try:
            target = torch.device(value)
        except (RuntimeError, TypeError, ValueError) as e:
            raise invalid(f"device {value!r} is not a device torch knows ({e})") from None
        if target.type == "cuda" and not torch.cuda.is_available():
            # Refused before reading rather than failing in the move after the whole load.
            raise invalid(f"device {value!r}: this torch sees no CUDA device")
        return "cpu" if target.type == "cpu" else target
    raise invalid(f"device {value!r} is not supported with numpy: numpy arrays live in CPU memory (use "
                  f"framework='pt' for a GPU)")


# The names dtype= accepts are the CLI's --dtype names (eredu/app/option_presets.hpp), in any
# letter case: one table for both front ends. "keep" (like None) casts nothing.
_CASTS = {name: target for name, target in _native.cast_choices()}


def cast_target(value):
    """The eredu dtype a `dtype=` argument names (F32, F16 or BF16), or None for no cast."""
    if value is None:
        return None
    text = value if isinstance(value, str) else getattr(value, "name", None) or str(value)
    text = text.replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    key = text.lower()
    if key not in _CASTS:
        names = ", ".join(_CASTS)
        raise invalid(f"dtype must be one of {names} (any case), a numpy or a torch float dtype, not {value!r}")
    return _CASTS[key]


def choice(name, value, allowed):
    if value not in allowed:
        raise invalid(f"{name} must be {', '.join(repr(a) for a in allowed[:-1])} or {allowed[-1]!r}, not {value!r}")
    return value
