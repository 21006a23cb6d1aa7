"""Writes the reference files that eredu's safetensors writers must reproduce byte for byte
(issue 32: `eredu.numpy.save_file/save` and `eredu.torch.save_file/save` as drop-ins).

Run where Hugging Face's safetensors and torch are installed (they are not on the machines
that run eredu's tests, so the files are kept in the tree):

    python3 make_reference.py OUT_DIR

Each case is one call of safetensors' own writer on deterministic tensors; MANIFEST.json
records the safetensors, torch and numpy versions and, per file, the writer, the metadata and
each tensor's dtype, shape and the seed of its values, and whether `save()` (bytes in memory)
gave the same bytes as `save_file()`; where it did not, `NAME.save.safetensors` holds save()'s.
"""

import json
import sys
from pathlib import Path

import numpy as np
import safetensors
import torch
from safetensors.numpy import save as np_save
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import save as torch_save
from safetensors.torch import save_file as torch_save_file


def values(seed, shape, dtype):
    """Deterministic values of `dtype` (a numpy dtype name) and `shape`, from `seed`."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), n, dtype=dtype).reshape(shape)
    return rng.standard_normal(n).astype(dtype).reshape(shape)


NUMPY_CASES = {
    "np_every_dtype": (
        [("b", "bool", [3]), ("u8", "uint8", [4, 3]), ("i8", "int8", [5]), ("u16", "uint16", [2, 2]),
         ("i16", "int16", [3]), ("u32", "uint32", [2]), ("i32", "int32", [2, 3]), ("u64", "uint64", [1]),
         ("i64", "int64", [3, 1]), ("f16", "float16", [7]), ("f32", "float32", [2, 5]), ("f64", "float64", [3])],
        None),
    "np_metadata": ([("weight", "float32", [4, 4]), ("bias", "float32", [4])],
                    {"format": "np", "note": "é ünïcode ☃", "empty": ""}),
    "np_order_and_padding": ([("z", "uint8", [1]), ("a", "float64", [1]), ("m", "uint8", [3]),
                              ("b", "float16", [1]), ("aa", "int32", [1])], None),
    "np_zero_sized_and_scalar": ([("empty", "float32", [0, 4]), ("scalar", "float32", []),
                                  ("row", "int64", [1, 0])], None),
    "np_names": ([("layers.0.attn.q_proj.weight", "float16", [2, 2]), ("ünï/cødé name", "float32", [1]),
                  ("with \"quote\" and \\ backslash", "int8", [2])], None),
}

TORCH_CASES = {
    "pt_every_dtype": [("bf16", torch.bfloat16, [3, 2]), ("f16", torch.float16, [4]), ("f32", torch.float32, [2, 2]),
                       ("f64", torch.float64, [2]), ("i64", torch.int64, [3]), ("i32", torch.int32, [1]),
                       ("i16", torch.int16, [2]), ("i8", torch.int8, [2]), ("u8", torch.uint8, [3]),
                       ("b", torch.bool, [4]), ("e4m3", torch.float8_e4m3fn, [5]), ("e5m2", torch.float8_e5m2, [5])],
    "pt_metadata": [("w", torch.bfloat16, [8, 3])],
}


def torch_values(seed, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g) == 1
    if not dtype.is_floating_point:
        return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"safetensors": safetensors.__version__, "torch": torch.__version__, "numpy": np.__version__,
                "files": {}}
    for i, (name, (specs, metadata)) in enumerate(NUMPY_CASES.items()):
        tensors = {t: values(1000 * i + j, shape, dt) for j, (t, dt, shape) in enumerate(specs)}
        np_save_file(tensors, str(out / f"{name}.safetensors"), metadata=metadata)
        in_memory = np_save(tensors, metadata=metadata)
        same = in_memory == (out / f"{name}.safetensors").read_bytes()
        if not same:  # save() and save_file() disagree: keep both
            (out / f"{name}.save.safetensors").write_bytes(in_memory)
        manifest["files"][f"{name}.safetensors"] = {
            "writer": "safetensors.numpy.save_file", "metadata": metadata, "save_gives_the_same_bytes": same,
            "tensors": [{"name": t, "dtype": dt, "shape": shape, "seed": 1000 * i + j}
                        for j, (t, dt, shape) in enumerate(specs)]}
    for i, (name, specs) in enumerate(TORCH_CASES.items()):
        tensors = {t: torch_values(5000 + 100 * i + j, shape, dt) for j, (t, dt, shape) in enumerate(specs)}
        metadata = {"format": "pt"} if name == "pt_metadata" else None
        torch_save_file(tensors, str(out / f"{name}.safetensors"), metadata=metadata)
        in_memory = torch_save(tensors, metadata=metadata)
        same = in_memory == (out / f"{name}.safetensors").read_bytes()
        if not same:
            (out / f"{name}.save.safetensors").write_bytes(in_memory)
        manifest["files"][f"{name}.safetensors"] = {
            "writer": "safetensors.torch.save_file", "metadata": metadata, "save_gives_the_same_bytes": same,
            "tensors": [{"name": t, "dtype": str(dt).removeprefix("torch."), "shape": shape,
                         "seed": 5000 + 100 * i + j} for j, (t, dt, shape) in enumerate(specs)]}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
