# safe_open behaves as Hugging Face safetensors' safe_open: keys, metadata, get_tensor(s), the
# context manager, "File is closed" once closed, backend=; plus eredu's additions (load,
# tensor_info, aget_tensor, directories).
import asyncio
import json
import struct

import numpy as np
import pytest

import eredu


@pytest.fixture
def sample(tmp_path, writer):
    arrays = {
        "zeta": np.arange(12, dtype=np.float32).reshape(3, 4),
        "alpha": np.arange(5, dtype=np.int64),
        "mid.weight": np.linspace(-1, 1, 6, dtype=np.float64).reshape(2, 3),
    }
    return writer(tmp_path / "sample.safetensors", arrays, {"format": "np", "note": "hi"}), arrays


def reference_read(path):
    """The tensors of a safetensors file, parsed here from its bytes (no eredu)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()}


def test_keys_are_sorted_and_offset_keys_follow_the_file(sample):
    path, arrays = sample
    with eredu.safe_open(path, framework="np") as f:
        assert f.keys() == sorted(arrays)
        assert f.offset_keys() == list(arrays)  # written in this order
        assert len(f) == 3 and "alpha" in f and "beta" not in f


def test_metadata_is_the_header_metadata_or_none(sample, tmp_path, writer):
    path, _ = sample
    with eredu.safe_open(path, "np") as f:
        assert f.metadata() == {"format": "np", "note": "hi"}
    bare = writer(tmp_path / "bare.safetensors", {"w": np.zeros(2, np.float32)})
    with eredu.safe_open(bare, "np") as f:
        assert f.metadata() is None


@pytest.mark.parametrize("framework", ["np", "numpy", "pt", "torch", "pytorch"])
def test_get_tensor_gives_the_file_bytes(sample, framework):
    if framework in ("pt", "torch", "pytorch"):
        torch = pytest.importorskip("torch")
    path, arrays = sample
    ref = reference_read(path)
    with eredu.safe_open(path, framework) as f:
        for name in f.keys():
            t = f.get_tensor(name)
            a = t if isinstance(t, np.ndarray) else t.numpy()
            assert a.tobytes() == ref[name] and a.shape == arrays[name].shape and a.dtype == arrays[name].dtype
            if framework not in ("np", "numpy"):
                assert isinstance(t, torch.Tensor)


def test_a_missing_tensor_is_a_key_error(sample):
    path, _ = sample
    with eredu.safe_open(path, "np") as f:
        with pytest.raises(eredu.TensorNotFoundError) as e:
            f.get_tensor("beta")
        assert isinstance(e.value, KeyError) and e.value.tensor == "beta" and e.value.kind == "tensor_not_found"
        assert "beta" in str(e.value) and str(path) in str(e.value)


def test_a_closed_file_refuses_reads_and_its_tensors_stay_valid(sample):
    path, arrays = sample
    f = eredu.safe_open(path, "np")
    zeta = f.get_tensor("zeta")
    f.close()
    with pytest.raises(eredu.InvalidArgumentError, match="closed"):
        f.get_tensor("zeta")
    with pytest.raises(eredu.InvalidArgumentError, match="closed"):
        f.get_slice("zeta")
    assert np.array_equal(zeta, arrays["zeta"])
    f.close()  # idempotent


CLOSED_CALLS = {
    "keys": lambda f: f.keys(), "offset_keys": lambda f: f.offset_keys(), "metadata": lambda f: f.metadata(),
    "get_tensor": lambda f: f.get_tensor("zeta"), "get_tensors": lambda f: f.get_tensors(),
    "get_slice": lambda f: f.get_slice("zeta"), "tensor_info": lambda f: f.tensor_info("zeta"),
    "load": lambda f: f.load(), "staging": lambda f: f.staging(), "files": lambda f: f.files,
    "len": len, "in": lambda f: "zeta" in f,
    "aget_tensor": lambda f: asyncio.run(f.aget_tensor("zeta")), "aload": lambda f: asyncio.run(f.aload()),
}


@pytest.mark.parametrize("call", list(CLOSED_CALLS))
def test_every_method_of_a_closed_file_says_it_is_closed(sample, call):
    # safetensors raises "File is closed" from every method once the `with` block has ended;
    # keys() and metadata() answering from a closed file would hide a use after close.
    path, _ = sample
    with eredu.safe_open(path, "np") as f:
        CLOSED_CALLS[call](f)  # answers while open
    with pytest.raises(eredu.InvalidArgumentError) as e:
        CLOSED_CALLS[call](f)
    assert "File is closed" in str(e.value) and isinstance(e.value, ValueError) and e.value.file == str(path)
    assert "closed" in repr(f) and f.path == str(path)  # what names it still answers


def test_a_slice_taken_before_close_reads_nothing_after(sample):
    path, arrays = sample
    with eredu.safe_open(path, "np") as f:
        s = f.get_slice("zeta")
    assert s.get_shape() == [3, 4] and s.get_dtype() == "F32"  # known without the file
    with pytest.raises(eredu.InvalidArgumentError, match="File is closed"):
        s[0:1]
    with pytest.raises(eredu.InvalidArgumentError, match="File is closed"):
        asyncio.run(s.aread((0,)))


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_get_tensors_is_every_tensor_in_file_order(sample, framework):
    # safetensors' get_tensors() (its load_file calls it): {name: tensor} in offset_keys() order.
    if framework == "pt":
        pytest.importorskip("torch")
    path, arrays = sample
    ref = reference_read(path)
    with eredu.safe_open(path, framework) as f:
        got = f.get_tensors()
        assert list(got) == f.offset_keys() == list(arrays)
    for name, t in got.items():
        a = t if isinstance(t, np.ndarray) else t.numpy()
        assert a.tobytes() == ref[name] and a.shape == arrays[name].shape


@pytest.mark.parametrize("backend", ["mmap", "pread"])
@pytest.mark.parametrize("framework", ["np", "pt"])
def test_both_backends_give_the_file_bytes(sample, backend, framework):
    if framework == "pt":
        pytest.importorskip("torch")
    path, arrays = sample
    ref = reference_read(path)
    with eredu.safe_open(path, framework, backend=backend) as f:
        got = {**f.get_tensors(), "slice": f.get_slice("zeta")[1:3]}
    for name in arrays:
        a = got[name] if framework == "np" else got[name].numpy()
        assert a.tobytes() == ref[name]
    sliced = got["slice"] if framework == "np" else got["slice"].numpy()
    assert np.array_equal(sliced, arrays["zeta"][1:3])
    loaded = eredu.load_file(path, framework, backend=backend)
    assert all((t if framework == "np" else t.numpy()).tobytes() == ref[n] for n, t in loaded.items())


def test_backend_pread_maps_nothing(tmp_path, writer):
    # A cast of a page-cache-resident tensor converts from a mapping of the file when eredu may map
    # (map_resident: eredu's default, backend="mmap"). backend="pread" maps nothing: the same cast
    # reads its bytes with pread into staging leases, which the pool's high-water mark shows.
    path = writer(tmp_path / "bf.safetensors", {"w": ("BF16", [1 << 16], b"\1" * (2 << 16))})
    path.read_bytes()  # resident
    with eredu.safe_open(path, "np", bf16="float32", backend="pread") as f:
        w = f.get_tensor("w")
        assert w.dtype == np.float32 and f.staging()["high_water"] > 0
    assert eredu._options.open_options(path, {"backend": "pread"})["reader"] == "pread"
    assert eredu._options.open_options(path, {"backend": "pread"})["map_resident"] is False
    assert eredu._options.open_options(path, {"backend": "mmap"}) == eredu._options.open_options(path, {})


@pytest.mark.parametrize("options, words", [
    ({"backend": "not_a_backend"}, "backend must be 'mmap' or 'pread', not 'not_a_backend'"),
    ({"backend": None, "beckend": "pread"}, "unknown option beckend"),
    ({"backend": "pread", "reader": "uring"}, "reader='uring' contradicts it"),
    ({"backend": "pread", "map_resident": True}, "map_resident=True contradicts it"),
    ({"backend": "pread", "weights": "map"}, "weights='map' contradicts it"),
])
def test_a_backend_eredu_cannot_honour_is_refused(sample, options, words):
    path, _ = sample
    with pytest.raises(eredu.InvalidArgumentError) as e:
        eredu.safe_open(path, "np", **options)
    assert words in str(e.value), str(e.value)


def test_the_context_manager_closes_even_on_error(sample):
    path, _ = sample
    with pytest.raises(RuntimeError):
        with eredu.safe_open(path, "np") as f:
            raise RuntimeError("boom")
    with pytest.raises(eredu.InvalidArgumentError):
        f.get_tensor("zeta")


def test_devices_other_than_the_cpu(sample):
    # numpy lives in CPU memory; torch tensors are moved to a device torch has (a GPU absent here
    # is refused before anything is read).
    path, _ = sample
    for device in ("cuda", "cuda:0", 0, "mps"):
        with pytest.raises(eredu.InvalidArgumentError, match="numpy arrays live in CPU memory"):
            eredu.safe_open(path, "np", device=device)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        for device in ("cuda", "cuda:0"):
            with pytest.raises(eredu.InvalidArgumentError, match="sees no CUDA device"):
                eredu.safe_open(path, "pt", device=device)
    with eredu.safe_open(path, "np", device="cpu"):
        pass


def test_load_reads_a_subset_as_one_unit_and_tensor_info_describes(sample):
    path, arrays = sample
    with eredu.safe_open(path, "np") as f:
        both = f.load(["zeta", "alpha"])
        assert list(both) == ["zeta", "alpha"]
        assert all(np.array_equal(both[k], arrays[k]) for k in both)
        assert list(f.load()) == list(arrays)
        info = f.tensor_info("zeta")
        assert (info.dtype, list(info.shape), info.nbytes) == ("F32", [3, 4], 48)
        with pytest.raises(eredu.TensorNotFoundError):
            f.load(["zeta", "nope"])


def test_aget_tensor(sample):
    path, arrays = sample

    async def main():
        with eredu.safe_open(path, "np") as f:
            values = await asyncio.gather(*(f.aget_tensor(n) for n in arrays))
        return values
    for value, expected in zip(asyncio.run(main()), arrays.values()):
        assert np.array_equal(value, expected)


def test_a_directory_with_one_file_opens(sample):
    path, arrays = sample
    with eredu.safe_open(path.parent, "np") as f:
        assert f.keys() == sorted(arrays)
        assert f.files == [str(path.parent / path.name)] or f.files[0].endswith("sample.safetensors")


def test_each_get_tensor_reads_its_own_storage(sample):
    torch = pytest.importorskip("torch")
    path, arrays = sample
    with eredu.safe_open(path, "pt") as f:
        a, b = f.get_tensor("zeta"), f.get_tensor("zeta")
    a[0, 0] = 42  # torch tensors are writable, and private to the call that read them
    assert b[0, 0] == arrays["zeta"][0, 0]
    with eredu.safe_open(path, "np") as f:
        n = f.get_tensor("zeta")
    # numpy marks every array it imports through DLPack read-only (as safetensors' numpy arrays,
    # np.frombuffer views, are too): copy() for a writable one.
    assert not n.flags.writeable
    with pytest.raises(ValueError):
        n[0, 0] = 1
