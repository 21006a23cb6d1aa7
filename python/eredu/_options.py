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
                    default), "map" (the checkpoint's page-cache pages, mapped read-only: no copy;
                    numpy arrays come back read-only) or "map-lock" (mapped and pinned with mlock,
                    within RLIMIT_MEMLOCK). Whole-checkpoint loads and safe_open only; numpy only
                    (torch has no read-only tensors, and a write to a read-only mapping kills the
                    process). The trade-offs are in docs/python.md.
"""

import os
import re

from ._errors import python_error

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_MIB = 1 << 20

OPEN_KEYS = ("budget", "threads", "depth", "request", "reader", "direct", "chunk", "map_resident", "copy_resident",
             "weights", "_faults")
WEIGHTS = ("copy", "map", "map-lock")


def invalid(detail, **where):
    return python_error("invalid_argument", detail, **where)


def parse_size(name, value):
    """Bytes from an int or a string such as "64M", "2GiB", "512k"."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise invalid(f"{name} must be a number of bytes, not {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        if not m:
            raise invalid(f"{name} must be a number of bytes such as 67108864 or '64M', not {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise invalid(f"{name} must be a number of bytes, not {type(value).__name__}")
    if n <= 0:
        raise invalid(f"{name} must be more than 0 bytes, not {value!r}")
    return n


def parse_count(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be a whole number, not {value!r}")
    if value < 1:
        raise invalid(f"{name} must be at least 1, not {value}")
    return value


def _checkpoint_bytes(path):
    """Bytes of the checkpoint's files, or None when that cannot be told cheaply."""
    try:
        if os.path.isfile(path):
            if path.endswith(".json"):
                path = os.path.dirname(path) or "."
            else:
                return os.path.getsize(path)
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".safetensors") and e.is_file())
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
    """Refuses a `weights` keyword that cannot be honoured: a value other than WEIGHTS, a mapping for
    torch (no read-only tensors: a write would kill the process with SIGSEGV), or any mapping where
    `where` (a class that only copies) names the caller."""
    value = options.get("weights")
    if value is None or value == "copy":
        return
    if value not in WEIGHTS:
        raise invalid(f"weights must be 'copy', 'map' or 'map-lock', not {value!r}")
    if where is not None:
        raise invalid(f"weights={value!r}: {where} copies its tensors (mapped weights are offered by load_file, "
                      f"aload and safe_open)")
    if fw == "pt":
        raise invalid(f"weights={value!r} needs framework='np': torch has no read-only tensors, and a write to "
                      f"the read-only mapping would kill the process")


def open_options(path, options, *, copy_resident=True):
    """The extension's option dict for opening `path` with the keywords `options`."""
    unknown = sorted(set(options) - set(OPEN_KEYS))
    if unknown:
        raise invalid(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                      f"(known: {', '.join(k for k in OPEN_KEYS if not k.startswith('_'))})")
    out = {"copy_resident": copy_resident}
    budget = parse_size("budget", options.get("budget"))
    if budget is None:
        # No point mapping (and, with io_uring, pinning) 64 MiB to read a small file.
        total = _checkpoint_bytes(os.fspath(path))
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
    if options.get("map_resident") is not None:
        out["map_resident"] = bool(options["map_resident"])
    if options.get("copy_resident") is not None:
        out["copy_resident"] = bool(options["copy_resident"])
    if options.get("weights") is not None:
        out["weights"] = options["weights"]  # check_weights validated it (every caller runs it first)
    if options.get("_faults") is not None:
        out["_faults"] = options["_faults"]
    return out


_FRAMEWORKS = {"np": "np", "numpy": "np", "pt": "pt", "torch": "pt", "pytorch": "pt"}


def framework(name):
    """ "np" or "pt" from the names safetensors accepts for numpy and torch."""
    fw = _FRAMEWORKS.get(name) if isinstance(name, str) else None
    if fw is None:
        raise invalid(f"framework must be 'np' (numpy) or 'pt' (torch), not {name!r}")
    return fw


def device(value):
    """Checks that `value` names the CPU; eredu's Python module loads into host memory only."""
    text = str(value)
    if text in ("cpu", "cpu:0"):
        return "cpu"
    raise invalid(f"device {value!r} is not supported: eredu's Python module loads into CPU memory only "
                  f"(the CUDA backend has no Python binding yet); use device='cpu' and move the tensors")


_CASTS = {
    "float32": "F32", "f32": "F32", "fp32": "F32", "float": "F32",
    "float16": "F16", "f16": "F16", "fp16": "F16", "half": "F16",
    "bfloat16": "BF16", "bf16": "BF16",
}


def cast_target(value):
    """The eredu dtype a `dtype=` argument names (F32, F16 or BF16), or None for no cast."""
    if value is None:
        return None
    text = value if isinstance(value, str) else getattr(value, "name", None) or str(value)
    text = text.replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    target = _CASTS.get(text.lower()) or (text.upper() if text.upper() in ("F32", "F16", "BF16") else None)
    if target is None:
        raise invalid(f"dtype must be float32, float16 or bfloat16 (a name, a numpy or a torch dtype), not {value!r}")
    return target


def choice(name, value, allowed):
    if value not in allowed:
        raise invalid(f"{name} must be {', '.join(repr(a) for a in allowed[:-1])} or {allowed[-1]!r}, not {value!r}")
    return value
