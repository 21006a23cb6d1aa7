# eredu.numpy's writers against Hugging Face safetensors' own output (issue 32): the files in
# data/safetensors_reference were written by safetensors 0.8.0 (see its README.md); loading
# each and writing it again must give the same bytes, up to the order of the metadata's keys,
# which safetensors itself does not fix.
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import eredu
import eredu.numpy as enp

REF = Path(__file__).resolve().parent / "data" / "safetensors_reference"
MANIFEST = json.loads((REF / "MANIFEST.json").read_text(encoding="utf-8"))
NUMPY_FILES = sorted(f for f, m in MANIFEST["files"].items() if m["writer"] == "safetensors.numpy.save_file")


def split(data):
    """(header as a dict in file order, header's raw bytes, tensor bytes)."""
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8:8 + n], data[8 + n:]


def without_metadata_order(data):
    header, raw, body = split(data)
    meta = header.pop("__metadata__", None)
    return (sorted(meta.items()) if meta else None, list(header.items()), len(raw), body)


@pytest.mark.parametrize("name", NUMPY_FILES)
def test_save_writes_what_safetensors_writes(name):
    reference = (REF / name).read_bytes()
    tensors = enp.load_file(REF / name)
    metadata = MANIFEST["files"][name]["metadata"]
    ours = enp.save(tensors, metadata=metadata)
    # The same tensors, order, offsets, padding and metadata; the keys' order is the caller's.
    assert without_metadata_order(ours) == without_metadata_order(reference)
    if MANIFEST["files"][name]["save_gives_the_same_bytes"]:
        assert ours == reference
    else:  # safetensors' save() and save_file() disagreed: ours matches one of them exactly
        assert ours in (reference, (REF / name.replace(".safetensors", ".save.safetensors")).read_bytes())


def test_save_orders_by_dtype_then_name_whatever_the_input_order():
    a = {"z": np.zeros(1, np.uint8), "a": np.zeros(1, np.float64), "m": np.zeros(3, np.uint8),
         "b": np.zeros(1, np.float16), "aa": np.zeros(1, np.int32)}
    b = dict(reversed(list(a.items())))
    assert enp.save(a) == enp.save(b)
    header, _, _ = split(enp.save(a))
    assert list(header) == ["a", "aa", "b", "m", "z"]


def test_save_file_is_whole_or_nothing(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.int64)}
    enp.save_file(tensors, path, metadata={"format": "np"})
    assert path.read_bytes() == enp.save(tensors, metadata={"format": "np"})
    loaded = enp.load_file(path)
    assert all(np.array_equal(loaded[k], v) for k, v in tensors.items())
    before = path.read_bytes()
    with pytest.raises(eredu.InvalidArgumentError):
        enp.save_file({"w": np.array([object()])}, path)  # no safetensors dtype
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]  # no temporary left behind


def test_load_reads_bytes_through_eredus_parser():
    tensors = {"x": np.arange(5, dtype=np.int16), "s": np.array(3.5, dtype=np.float64)}
    back = enp.load(enp.save(tensors))
    assert back.keys() == tensors.keys()
    assert all(np.array_equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())
    assert enp.load((REF / "np_every_dtype.safetensors").read_bytes()).keys() == enp.load_file(
        REF / "np_every_dtype.safetensors").keys()
    with pytest.raises(eredu.FormatError):
        enp.load(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(eredu.InvalidArgumentError):
        enp.load("not bytes")


def test_big_endian_arrays_are_written_little_endian():
    be = np.arange(4, dtype=">i4")
    assert enp.save({"x": be}) == enp.save({"x": be.astype("<i4")})


@pytest.mark.parametrize("bad, what", [
    ({"x": [1, 2]}, "not a numpy array"),
    ({1: np.zeros(1)}, "must be a str"),
    ({"__metadata__": np.zeros(1)}, "reserved"),
])
def test_bad_tensors_are_refused_typed(bad, what):
    with pytest.raises(eredu.InvalidArgumentError, match=what):
        enp.save(bad)


@pytest.mark.parametrize("metadata", [{"k": 1}, {2: "v"}, ["k", "v"]])
def test_metadata_must_map_str_to_str(metadata):
    with pytest.raises(eredu.InvalidArgumentError, match="metadata"):
        enp.save({"x": np.zeros(1)}, metadata=metadata)


# --- eredu.torch: the same files, written from torch tensors ---

TORCH_FILES = sorted(f for f, m in MANIFEST["files"].items() if m["writer"] == "safetensors.torch.save_file")


def torch_or_skip(name=None):
    torch = pytest.importorskip("torch", reason="eredu.torch's writers need torch")
    if name is not None:
        missing = [t["dtype"] for t in MANIFEST["files"][name]["tensors"] if not hasattr(torch, t["dtype"])]
        if missing:
            pytest.skip(f"this torch ({torch.__version__}) has no {', '.join(missing)}: {name} cannot be loaded")
    return torch


@pytest.mark.parametrize("name", TORCH_FILES)
def test_torch_save_writes_what_safetensors_writes(name):
    torch_or_skip(name)
    import eredu.torch as et
    reference = (REF / name).read_bytes()
    ours = et.save(et.load_file(REF / name), metadata=MANIFEST["files"][name]["metadata"])
    assert ours == reference


def test_torch_save_file_load_and_refusals(tmp_path):
    torch = torch_or_skip()
    import eredu.torch as et
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = {"w": w, "h": torch.ones(2, dtype=torch.bfloat16), "s": torch.tensor(7, dtype=torch.int64)}
    path = tmp_path / "m.safetensors"
    et.save_file(tensors, path)
    assert path.read_bytes() == et.save(tensors)
    back = et.load(path.read_bytes())
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())
    before = path.read_bytes()
    with pytest.raises(eredu.InvalidArgumentError, match="not contiguous"):
        et.save_file({"t": w.t()}, path)
    with pytest.raises(eredu.SharedTensorsError, match="share memory") as shared:
        et.save_file({"a": w, "b": w[1:]}, path)  # tied weights: safetensors refuses them too
    assert isinstance(shared.value, RuntimeError) and isinstance(shared.value, ValueError)
    with pytest.raises(eredu.InvalidArgumentError, match="expected torch.Tensor but received <class 'list'>"):
        et.save({"a": [1.0]})
    assert path.read_bytes() == before
    # Views of disjoint parts of one storage do not overlap: both are written.
    parts = et.load(et.save({"a": w[0], "b": w[1]}))
    assert torch.equal(parts["a"], w[0]) and torch.equal(parts["b"], w[1])
