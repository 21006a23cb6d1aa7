# Shared fixtures of the Python tests: a safetensors writer (pure Python, so the tests do not
# depend on the code under test to make their inputs), the real checkpoints of ../shared/data,
# and the `eredu` command when the build has it.
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

# Run from the build tree (ctest sets PYTHONPATH), or straight from a checkout with an installed module.
REPO = Path(__file__).resolve().parents[2]

NP_OF = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16, "F16": np.float16,
    "I32": np.int32, "U32": np.uint32, "F32": np.float32, "F64": np.float64, "I64": np.int64, "U64": np.uint64,
    "C64": np.complex64,
}
ITEM_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
             "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
             "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def write_safetensors(path, tensors, metadata=None):
    """Writes `tensors` {name: np.ndarray | (dtype, shape, raw bytes)} in order, as the reference writer
    lays them out (header padded with spaces to 8 bytes). Returns the path."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if isinstance(t, np.ndarray):
            dtype = next(k for k, v in NP_OF.items() if np.dtype(v) == t.dtype)
            shape, raw = list(t.shape), np.ascontiguousarray(t).tobytes()
        else:
            dtype, shape, raw = t
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return Path(path)


def write_sidecar(path, corrupt_from=None):
    """Writes <file>.sha256.json with each tensor's SHA-256 (of `corrupt_from`'s bytes when given),
    read from the safetensors layout itself."""
    data = Path(corrupt_from or path).read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    start = 8 + n
    digests = {name: sha256(data[start + e["data_offsets"][0]:start + e["data_offsets"][1]])
               for name, e in json.loads(data[8:start]).items() if name != "__metadata__"}
    Path(str(path) + ".sha256.json").write_text(json.dumps(digests))


def bf16_bits(values):
    """BF16 bits of float32 values, rounded to nearest even (as torch and eredu round)."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def tensor_bytes(t):
    """The bytes of a numpy array or torch tensor, whatever its dtype."""
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).tobytes()
    import torch
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy().tobytes()


@pytest.fixture
def writer():
    return write_safetensors


def shared_data_dir():
    d = Path(os.environ.get("EREDU_SHARED_DATA_DIR", REPO.parent / "shared" / "data"))
    return d if (d / "real" / "MANIFEST.json").is_file() else None


@pytest.fixture
def real_dir():
    d = shared_data_dir()
    if d is None:
        pytest.skip("no real checkpoints under ../shared/data/real (EREDU_SHARED_DATA_DIR): skipping")
    return d / "real"


@pytest.fixture
def manifest(real_dir):
    return json.loads((real_dir / "MANIFEST.json").read_text())


@pytest.fixture
def eredu_cli():
    cli = os.environ.get("EREDU_CLI")
    if not cli or not Path(cli).exists():
        pytest.skip("the eredu command is not built (EREDU_CLI unset): skipping")
    return cli


@pytest.fixture
def llama_like(tmp_path):
    """A small Llama-shaped F32 checkpoint: embed, 4 layers of 3 tensors, norm, head; and its arrays."""
    rng = np.random.default_rng(7)
    arrays = {"model.embed_tokens.weight": rng.standard_normal((64, 16), dtype=np.float32)}
    for i in range(4):
        arrays[f"model.layers.{i}.self_attn.q_proj.weight"] = rng.standard_normal((16, 16), dtype=np.float32)
        arrays[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal((32, 16), dtype=np.float32)
        arrays[f"model.layers.{i}.input_layernorm.weight"] = rng.standard_normal((16,), dtype=np.float32)
    arrays["model.norm.weight"] = rng.standard_normal((16,), dtype=np.float32)
    arrays["lm_head.weight"] = rng.standard_normal((64, 16), dtype=np.float32)
    path = write_safetensors(tmp_path / "llama.safetensors", arrays, {"format": "pt"})
    return path, arrays


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")



# safetensors' own tests run through their runner (safetensors_suite/run_suite.py: a shim on
# sys.path, a scratch directory), never collected with eredu's.
collect_ignore = ["safetensors_suite"]


def settled_live_bytes(expected, within=5.0):
    """eredu's live tensor bytes once they equal `expected`, or what they are after `within`
    seconds: the storage of a cancelled load is freed by eredu's loop just after the
    cancellation is reported (docs/reliability.md), not before the exception reaches Python."""
    import time

    import eredu
    deadline = time.monotonic() + within
    while (now := eredu.storage_stats()["live_bytes"]) != expected and time.monotonic() < deadline:
        time.sleep(0.001)
    return now
