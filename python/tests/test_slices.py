# get_slice: every index form safetensors' PySafeSlice takes gives what numpy indexing of the
# whole tensor gives, reads only the selected bytes, and the forms it refuses are typed errors;
# bounds past a dimension raise as safetensors >= 0.6 raises, not clamped.
import os

import numpy as np
import pytest

import eredu
from conftest import bf16_bits

INDICES = [
    (), Ellipsis, 0, -1, 3, slice(None), slice(1, 4), slice(-3, None), slice(None, -2), slice(5, 2), slice(2, 7),
    slice(7, None), slice(-7, 7), [], (slice(None), slice(5, 5)),
    (slice(1, 3), slice(None)), (slice(None), 2), (slice(None), slice(1, 4)), (0, 1), (-1, -1, -1),
    (slice(1, 3), slice(0, 2), slice(1, 2)), (Ellipsis, 1), (Ellipsis, slice(0, 1)), (1, Ellipsis),
    (slice(0, 7), Ellipsis, slice(2, 3)), (np.int64(2),), (slice(0, 0), slice(None)), (slice(None, None, 1), 4),
]


@pytest.fixture
def cube(tmp_path, writer):
    rng = np.random.default_rng(3)
    arrays = {
        "f32": rng.standard_normal((7, 5, 3)).astype(np.float32),
        "i16": np.arange(7 * 5 * 3, dtype=np.int16).reshape(7, 5, 3),
        "u8": np.arange(7 * 5 * 3, dtype=np.uint8).reshape(7, 5, 3),
    }
    bf16 = bf16_bits(rng.standard_normal((7, 5, 3)))
    tensors = dict(arrays)
    tensors["bf16"] = ("BF16", [7, 5, 3], bf16.tobytes())
    tensors["scalar"] = np.array(2.5, dtype=np.float64)
    return writer(tmp_path / "cube.safetensors", tensors), arrays, bf16


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_slices_equal_numpy_slicing(cube, index):
    path, arrays, bf16 = cube
    with eredu.safe_open(path, "np") as f:
        for name, whole in list(arrays.items()) + [("bf16", bf16)]:
            got = f.get_slice(name)[index]
            want = whole[index]
            assert got.shape == want.shape and got.dtype == want.dtype, (name, index)
            assert np.array_equal(got, want), (name, index)


@pytest.mark.parametrize("index", [(slice(1, 4),), (slice(None), 2), (Ellipsis, 0)], ids=repr)
def test_torch_slices(cube, index):
    torch = pytest.importorskip("torch")
    path, arrays, bf16 = cube
    with eredu.safe_open(path, "pt") as f:
        assert np.array_equal(f.get_slice("f32")[index].numpy(), arrays["f32"][index])
        got = f.get_slice("bf16")[index]
        assert got.dtype == torch.bfloat16
        assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), bf16[index])


def test_slice_shape_and_dtype_without_reading(cube):
    path, _, _ = cube
    with eredu.safe_open(path, "np") as f:
        s = f.get_slice("bf16")
        assert s.get_shape() == [7, 5, 3] and s.get_dtype() == "BF16" and len(s) == 7 and s.ndim == 3
        scalar = f.get_slice("scalar")
        assert scalar.get_shape() == [] and scalar[()] == 2.5 and scalar[...] == 2.5


@pytest.mark.parametrize("index, words", [
    (slice(None, None, 2), "step of 2 is not supported"),
    ((slice(None), slice(None, None, -1)), "step of -1"),
    (None, "index None is not supported"),
    ((0, None), "index None"),
    ([0, 1], "a non-empty list (fancy indexing) is not supported"),
    (np.array([0, 1]), "type ndarray is not supported"),
    (True, "index True is not supported"),
    ((0, 0, 0, 0), "too many indices for a tensor of rank 3"),
    ((Ellipsis, Ellipsis), "single ellipsis"),
    (7, "slicing [7] with shape [7, 5, 3]: index 7 out of bounds for tensor dimension #0 of size 7"),
    (-8, "index -8 out of bounds for tensor dimension #0 of size 7"),
    ((0, 5), "slicing [0, 5] with shape [7, 5, 3]: index 5 out of bounds for tensor dimension #1 of size 5"),
    ([[]], "a non-empty list (fancy indexing) is not supported"),
    (([], 0), "type list is not supported"),
    ("a", "type str is not supported"),
])
def test_refused_index_forms_are_selection_errors(cube, index, words):
    path, _, _ = cube
    with eredu.safe_open(path, "np") as f:
        with pytest.raises(eredu.SelectionError) as e:
            f.get_slice("f32")[index]
        assert words in e.value.message and isinstance(e.value, IndexError)
        assert e.value.kind == "invalid_selection" and e.value.tensor == "f32"
        # Where safetensors raises the same error, str() is its words; the message is the note.
        if e.value.text is not None:
            assert str(e.value) == e.value.text and e.value.__notes__ == [e.value.message]


@pytest.mark.parametrize("index, words", [
    (slice(None, 20), "slicing [:20] with shape [7, 5, 3]: index 19 out of bounds for tensor dimension #0 of size 7"),
    ((slice(None), slice(None, 20)),
     "slicing [:, :20] with shape [7, 5, 3]: index 19 out of bounds for tensor dimension #1 of size 5"),
    (slice(2, 8), "index 7 out of bounds for tensor dimension #0 of size 7"),
    (slice(8, None), "index 8 out of bounds for tensor dimension #0 of size 7"),
    (slice(-8, None), "index -8 out of bounds for tensor dimension #0 of size 7"),
    (slice(None, -8), "index -8 out of bounds for tensor dimension #0 of size 7"),
    ((Ellipsis, slice(1, 4)), "slicing [..., 1:4] with shape [7, 5, 3]: index 3 out of bounds for tensor "
                              "dimension #2 of size 3"),
])
def test_bounds_past_a_dimension_raise_not_clamp(cube, index, words):
    # Python's slices clamp (numpy's [:20] of 7 rows is 7 rows); safetensors >= 0.6 refuses, and
    # so does eredu: a tensor-parallel shard computed past the end is a bug to report, not to hide.
    path, _, _ = cube
    for framework in ("np", "pt"):
        if framework == "pt":
            pytest.importorskip("torch")
        with eredu.safe_open(path, framework) as f:
            with pytest.raises(eredu.SelectionError) as e:
                f.get_slice("f32")[index]
        assert words in str(e.value), str(e.value)
        assert isinstance(e.value, IndexError) and e.value.kind == "invalid_selection" and e.value.tensor == "f32"


def test_safetensors_own_out_of_bounds_cases(tmp_path, writer):
    # safetensors' test_numpy_slice: a (10, 5) tensor, its messages word for word after the file
    # and tensor eredu's messages start with.
    a = np.random.default_rng(0).random((10, 5))
    path = writer(tmp_path / "slice.safetensors", {"a": a})
    with eredu.safe_open(path, "np") as f:
        s = f.get_slice("a")
        assert np.array_equal(s[:10], a) and np.array_equal(s[:, :5], a)
        for index, words in ((slice(None, 20), "slicing [:20] with shape [10, 5]: index 19 out of bounds for "
                                               "tensor dimension #0 of size 10"),
                             ((slice(None), slice(None, 20)), "slicing [:, :20] with shape [10, 5]: index 19 out of "
                                                              "bounds for tensor dimension #1 of size 5"),
                             ((slice(2, None), 20), "slicing [2:, 20] with shape [10, 5]: index 20 out of bounds for "
                                                    "tensor dimension #1 of size 5")):
            with pytest.raises(eredu.SelectionError, match="out of bounds") as e:
                s[index]
            assert e.value.message == f"{path}: tensor 'a': {words} [invalid_selection]"
            assert str(e.value) == f"Error during {words}"  # safetensors' str(), exactly
        with pytest.raises(eredu.SelectionError) as e:
            s[2:, -6]
        assert str(e.value) == "Invalid index -6 for dimension 1 of size 5"
        with pytest.raises(eredu.SelectionError) as e:
            s[[0, 1]]
        assert str(e.value) == "Non empty lists are not implemented"


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_an_empty_list_selects_no_row(tmp_path, writer, framework):
    # safetensors (and numpy, and torch) give `t[[]]` as an empty selection of dimension 0.
    if framework == "pt":
        torch = pytest.importorskip("torch")
    a = np.arange(50, dtype=np.float32).reshape(10, 5)
    path = writer(tmp_path / "rows.safetensors", {"a": a, "s": np.array(1.0, np.float32)})
    with eredu.safe_open(path, framework) as f:
        got = f.get_slice("a")[[]]
        assert tuple(got.shape) == (0, 5) == a[[]].shape
        if framework == "pt":
            assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(a)[[]])
        else:
            assert got.dtype == np.float32
        with pytest.raises(eredu.SelectionError, match="too many indices for a tensor of rank 0"):
            f.get_slice("s")[[]]  # a scalar has no dimension 0 (safetensors: too many slices)


def test_a_file_cut_after_open_fails_every_slice_typed(tmp_path, writer):
    # The file loses its tail after it was opened: since the library checks that a file has not
    # changed since open (errc::file_changed), every read of it, a slice before the cut too,
    # fails with a typed I/O error naming the tensor and its offset; nothing is delivered.
    rows = np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024)
    path = writer(tmp_path / "rows.safetensors", {"rows": rows})
    with eredu.safe_open(path, "np") as f:
        data_start = os.path.getsize(path) - rows.nbytes
        assert np.array_equal(f.get_slice("rows")[2:10], rows[2:10])
        os.truncate(path, data_start + 16 * 4096)  # keep rows 0..15
        for read in (lambda: f.get_slice("rows")[2:10], lambda: f.get_tensor("rows"),
                     lambda: f.get_slice("rows")[20:21]):
            with pytest.raises(eredu.IoError) as e:
                read()
            assert e.value.kind in ("unexpected_eof", "file_changed") and e.value.tensor == "rows"
            assert e.value.offset is not None and e.value.file == str(path)


def test_async_slice(cube):
    import asyncio
    path, arrays, _ = cube

    async def main():
        with eredu.safe_open(path, "np") as f:
            return await f.get_slice("f32").aread((slice(1, 3), 0))
    assert np.array_equal(asyncio.run(main()), arrays["f32"][1:3, 0])
    got = asyncio.run(eredu.aread(path, "i16", index=(Ellipsis, 2)))
    assert np.array_equal(got, arrays["i16"][..., 2])


def _read_bytes(reads):
    """The set of file bytes a list of (file, offset, length) reads covered, as merged intervals."""
    merged = []
    for _, off, n in sorted(reads, key=lambda r: r[1]):
        if merged and off <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], off + n)
        else:
            merged.append([off, off + n])
    return merged


@pytest.mark.parametrize("index", [
    slice(10, 12), -1, (slice(100, 164), slice(None)), (slice(3, 4), slice(7, 9)), (slice(None), slice(0, 1)),
    (slice(250, 252), slice(1000, None)), (slice(7, 9), 4095),
], ids=repr)
def test_a_slice_reads_only_the_selected_bytes(tmp_path, writer, index):
    # What the reader was asked for, recorded at each completed read (the gate made open only
    # records; it also keeps resident pages from being mapped, so every byte is a read): exactly
    # the selected elements' bytes, each once, nothing else of the tensor.
    whole = np.arange(256 * 4096, dtype=np.float32).reshape(256, 4096)
    path = writer(tmp_path / "rows.safetensors", {"pad": np.zeros(1000, np.uint8), "rows": whole})
    start = os.path.getsize(path) - whole.nbytes
    gate = eredu._native._ReadGate(open=True)
    with eredu.safe_open(path, "np", _faults=gate) as f:
        before = len(gate.reads())  # opening reads the header
        got = f.get_slice("rows")[index]
        assert np.array_equal(got, whole[index])
        reads = gate.reads()[before:]
    # The file offset of every byte of the tensor, sliced as the tensor is: the bytes to read.
    offsets = (start + np.arange(whole.nbytes, dtype=np.int64)).reshape(256, 4096, 4)[index].reshape(-1)
    want = _read_bytes([(0, int(o), 4) for o in offsets[::4]])
    assert _read_bytes(reads) == want, (reads[:4], want[:4])
    assert sum(n for _, _, n in reads) == offsets.size  # no byte read twice
