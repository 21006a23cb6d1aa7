# Malformed checkpoints (the real ones of ../shared/data/real/malformed and hand-made ones) raise
# the right eredu exception, with the library's kind, file, tensor and offset.
import asyncio
import errno
import json
import os
import pickle
import struct

import numpy as np
import pytest

import eredu


def raw_file(path, header, data=b"", pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def test_real_malformed_files(real_dir):
    lfs = real_dir / "malformed/lfs-pointer-pusht-frame_0.safetensors"
    with pytest.raises(eredu.FormatError) as e:
        eredu.load_file(lfs)
    assert e.value.kind == "header_too_large" and e.value.file == str(lfs) and "git lfs" in str(e.value).lower()
    abuse = real_dir / "malformed/safetensors_abuse_attempt_1.safetensors"
    with pytest.raises(eredu.FormatError) as e:
        eredu.safe_open(abuse, "pt")
    assert e.value.kind == "invalid_header_length" and e.value.family == "format" and e.value.file == str(abuse)


@pytest.mark.parametrize("case, kind", [
    ("short", "header_too_small"),
    ("bad_json", "invalid_header_json"),
    ("not_object", "header_not_object"),
    ("bad_dtype", "unknown_dtype"),
    ("gap", "invalid_offset"),
    ("size_mismatch", "tensor_size_mismatch"),
    ("truncated", "incomplete_data"),
    ("duplicate", "duplicate_tensor"),
    ("bad_metadata", "invalid_metadata"),
])
def test_hand_made_malformed_files(tmp_path, case, kind):
    p = tmp_path / f"{case}.safetensors"
    if case == "short":
        p.write_bytes(b"\x01\x02")
    elif case == "bad_json":
        raw_file(p, b'{"w": {"dtype": "F32",')
    elif case == "not_object":
        raw_file(p, [1, 2])
    elif case == "bad_dtype":
        raw_file(p, {"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    elif case == "gap":
        raw_file(p, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                     "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12)
    elif case == "size_mismatch":
        raw_file(p, {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
    elif case == "truncated":
        raw_file(p, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 10)
    elif case == "duplicate":
        raw_file(p, b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                    b'"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}', b"\0\0")
    elif case == "bad_metadata":
        raw_file(p, {"__metadata__": {"k": 1}, "w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    for framework in ("np", "pt"):
        with pytest.raises(eredu.FormatError) as e:
            eredu.load_file(p, framework)
        assert e.value.kind == kind and e.value.file == str(p), str(e.value)
        assert str(e.value).startswith(str(p)) and f"[{kind}]" in str(e.value)
    if case == "gap":
        assert e.value.tensor == "b" and e.value.offset is not None


def test_sharded_index_errors(tmp_path, writer):
    d = tmp_path / "sharded"
    d.mkdir()
    writer(d / "a.safetensors", {"x": np.zeros(2, np.float32)})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}))
    with pytest.raises(eredu.FormatError) as e:
        eredu.load_file(d)
    assert e.value.kind == "shard_missing" and "b.safetensors" in str(e.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(eredu.FormatError) as e:
        eredu.safe_open(empty, "np")
    assert e.value.kind == "unknown_format"


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError) as e:
        eredu.load_file(tmp_path / "absent.safetensors")
    assert isinstance(e.value, eredu.IoError) and e.value.errno == 2


@pytest.mark.parametrize("entry", ["load_file", "safe_open", "aload"])
def test_a_missing_file_is_a_file_not_found_error(tmp_path, entry):
    # `except FileNotFoundError:` (what safetensors raises, and what open() raises) catches it, and
    # so does `except eredu.IoError:`; OSError's own fields say what they say for open().
    missing = tmp_path / "absent.safetensors"
    call = {"load_file": lambda: eredu.load_file(missing), "safe_open": lambda: eredu.safe_open(missing, "pt"),
            "aload": lambda: asyncio.run(eredu.aload(missing))}[entry]
    with pytest.raises(FileNotFoundError) as e:
        call()
    assert isinstance(e.value, eredu.IoError) and isinstance(e.value, eredu.Error)
    assert e.value.errno == errno.ENOENT and e.value.strerror == os.strerror(errno.ENOENT)
    assert e.value.filename == e.value.file == str(missing) and str(missing) in str(e.value)
    assert e.value.kind == "io_error"
    again = pickle.loads(pickle.dumps(e.value))  # multiprocessing hands errors over pickled
    assert type(again) is type(e.value) and again.errno == errno.ENOENT and str(again) == str(e.value)
    assert again.filename == str(missing)


def test_a_path_through_a_file_is_a_not_a_directory_error(tmp_path, writer):
    path = writer(tmp_path / "a.safetensors", {"w": np.zeros(2, np.float32)})
    with pytest.raises(NotADirectoryError) as e:
        eredu.load_file(path / "b.safetensors")
    assert isinstance(e.value, eredu.IoError) and e.value.errno == errno.ENOTDIR


def test_an_unreadable_file_is_a_permission_error(tmp_path, writer):
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000: no EACCES to see")
    path = writer(tmp_path / "a.safetensors", {"w": np.zeros(2, np.float32)})
    path.chmod(0)
    with pytest.raises(PermissionError) as e:
        eredu.load_file(path)
    assert isinstance(e.value, eredu.IoError) and e.value.errno == errno.EACCES


@pytest.mark.parametrize("number, builtin", [
    (errno.ENOENT, FileNotFoundError), (errno.EACCES, PermissionError), (errno.EPERM, PermissionError),
    (errno.EISDIR, IsADirectoryError), (errno.ENOTDIR, NotADirectoryError), (errno.EEXIST, FileExistsError),
    (errno.EINTR, InterruptedError), (errno.EAGAIN, BlockingIOError), (errno.ETIMEDOUT, TimeoutError),
])
def test_every_errno_python_maps_is_raised_as_its_os_error_subclass(number, builtin):
    # The library's errors reach Python through _from_native; an I/O error's errno picks the
    # OSError subclass Python itself picks (OSError(errno, ...)), under eredu.IoError.
    e = eredu._errors._from_native("io_error", "store", "f: read: boom [io_error]", "boom", "f", "t", None, 7, number)
    assert type(e) is not eredu.IoError and isinstance(e, builtin) and isinstance(e, eredu.IoError)
    assert type(OSError(number, "x")) is builtin and e.errno == number and e.offset == 7
    assert type(pickle.loads(pickle.dumps(e))) is type(e)
    plain = eredu._errors._from_native("io_error", "store", "m", "m", "f", None, None, None, errno.EIO)
    assert type(plain) is eredu.IoError and plain.errno == errno.EIO
    eof = eredu._errors._from_native("unexpected_eof", "store", "m", "m", "f", None, None, None, None)
    assert type(eof) is eredu.IoError and eof.errno is None


def test_a_file_truncated_after_open_fails_the_whole_load(tmp_path, writer):
    arrays = {f"t{i}": np.full(1 << 14, i, dtype=np.float32) for i in range(8)}
    path = writer(tmp_path / "t.safetensors", arrays)
    before = eredu.storage_stats()["live_bytes"]
    with eredu.safe_open(path, "np") as f:
        os.truncate(path, os.path.getsize(path) - 3 * (1 << 16))
        with pytest.raises(eredu.IoError) as e:
            f.load()  # all or nothing: no dict, nothing half-loaded
        assert e.value.kind in ("unexpected_eof", "file_changed") and e.value.tensor in arrays
        assert e.value.file == str(path) and e.value.offset is not None
        assert f.staging()["in_use"] == 0
        with pytest.raises(eredu.IoError) as e:  # a file changed since open serves no tensor
            f.get_tensor("t0")
        assert e.value.kind in ("unexpected_eof", "file_changed") and e.value.tensor == "t0"
    assert eredu.storage_stats()["live_bytes"] == before


def test_options_the_library_refuses_are_typed(tmp_path, writer):
    path = writer(tmp_path / "a.safetensors", {"w": np.zeros(1 << 20, np.uint8)})
    with eredu.safe_open(path, "np", budget=4096, dtype=None) as f:
        assert f.get_tensor("w").nbytes == 1 << 20  # a dtype-kept read needs no staging
    bf = writer(tmp_path / "b.safetensors", {"w": ("BF16", [1 << 20], b"\0" * (2 << 20))})
    with eredu.safe_open(bf, "np", budget=4096, bf16="float32", map_resident=False) as f:
        # A cast stages in chunks that fit the budget: still within it, still correct.
        w = f.get_tensor("w")
        assert w.dtype == np.float32 and not w.any() and f.staging()["high_water"] <= 4096
