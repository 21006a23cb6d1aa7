# The package: version, the exception hierarchy, option validation, the storage counters.
import asyncio
import re

import numpy as np
import pytest

import eredu
from conftest import REPO


def test_version_is_the_project_version():
    cmake = (REPO / "CMakeLists.txt").read_text()
    version = re.search(r"project\(eredu VERSION (\S+)", cmake).group(1)
    assert eredu.__version__ == version


def test_hierarchy_subclasses_the_builtin_exceptions_users_catch():
    assert issubclass(eredu.IoError, eredu.StoreError) and issubclass(eredu.IoError, OSError)
    assert issubclass(eredu.TensorNotFoundError, KeyError)
    assert issubclass(eredu.SelectionError, IndexError)
    assert issubclass(eredu.InvalidArgumentError, ValueError)
    assert issubclass(eredu.UnsupportedDTypeError, TypeError)
    assert issubclass(eredu.OutOfMemoryError, MemoryError)
    assert issubclass(eredu.CancelledError, asyncio.CancelledError)
    assert issubclass(eredu.CanaryError, eredu.OrchestrationError)
    for cls in (eredu.FormatError, eredu.StoreError, eredu.ChecksumError, eredu.RecipeError, eredu.BackendError):
        assert issubclass(cls, eredu.Error)


def test_the_os_error_subclasses_are_io_errors_and_not_exported_by_name():
    # `except FileNotFoundError` and `except eredu.IoError` both catch a missing file; a
    # `from eredu import *` must not replace the builtin FileNotFoundError with eredu's.
    cls = eredu._errors.io_error_class(2)
    assert issubclass(cls, FileNotFoundError) and issubclass(cls, eredu.IoError) and cls is not eredu.IoError
    assert eredu._errors.io_error_class(None) is eredu.IoError and eredu._errors.io_error_class(5) is eredu.IoError
    space = {}
    exec("from eredu import *", space)
    assert "FileNotFoundError" not in space and "PermissionError" not in space
    assert space["SafetensorError"] is eredu.SafetensorError is eredu.Error  # safetensors' catch-all name


def test_a_library_error_keeps_its_message_and_parts(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(eredu.IoError) as e:
        eredu.load_file(missing)
    assert e.value.kind == "io_error" and e.value.family == "store"
    assert e.value.errno == 2 and e.value.file == str(missing)
    # safetensors' words in str(), the library's message (file and kind) as the note a traceback prints.
    assert str(e.value) == f"No such file or directory: {missing}" and isinstance(e.value, FileNotFoundError)
    assert e.value.message == f"{missing}: cannot open the checkpoint [io_error] (No such file or directory)"
    assert e.value.__notes__ == [e.value.message]


@pytest.mark.parametrize("kwargs, words", [
    ({"framework": "tf"}, "framework must be 'np'"),
    ({"device": "cuda:0"}, "numpy arrays live in CPU memory"),
    ({"budget": 0}, "budget must be from 4096 (4K) to 1099511627776 (1T) bytes, not 0"),
    ({"budget": "12 parsecs"}, "budget must be a number of bytes"),
    ({"threads": 0}, "threads must be from 1 to 1024, not 0"),
    ({"dtype": "int8"}, "dtype must be one of keep, bf16, bfloat16, f16, fp16, float16, half, f32, fp32, float32, float"),
    ({"reader": "mmap"}, "reader must be"),
    ({"bf16": "float64"}, "bf16 must be"),
    ({"unsupported": "ignore"}, "unsupported must be"),
    ({"compression": "zstd"}, "unknown option compression"),
])
def test_bad_options_are_typed_errors(tmp_path, writer, kwargs, words):
    path = writer(tmp_path / "a.safetensors", {"w": np.arange(4, dtype=np.float32)})
    with pytest.raises(eredu.InvalidArgumentError) as e:
        eredu.load_file(path, **kwargs)
    assert words in str(e.value) and e.value.kind == "invalid_argument"


def test_sizes_accept_suffixes(tmp_path, writer):
    path = writer(tmp_path / "a.safetensors", {"w": np.arange(4, dtype=np.float32)})
    with eredu.safe_open(path, "np", budget="2M") as f:
        assert f.staging()["budget"] == 2 << 20


def test_storage_counters_report_live_bytes(tmp_path, writer):
    path = writer(tmp_path / "a.safetensors", {"w": np.zeros(1 << 16, dtype=np.float32)})
    before = eredu.storage_stats()["live_bytes"]
    d = eredu.load_file(path)
    assert eredu.storage_stats()["live_bytes"] >= before + (1 << 18)
    del d
    assert eredu.storage_stats()["live_bytes"] == before


def test_the_numpy_and_torch_modules_mirror_safetensors(tmp_path, writer):
    torch = pytest.importorskip("torch")
    from eredu.numpy import load_file as np_load
    from eredu.torch import load_file as pt_load
    path = writer(tmp_path / "a.safetensors", {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert np.array_equal(np_load(path)["w"], np.arange(6).reshape(2, 3))
    assert torch.equal(pt_load(path, device="cpu")["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))


def test_torch_tensors_go_to_the_device_asked_for(tmp_path, writer):
    # eredu loads into CPU memory; for torch, device= moves the tensors on, as safetensors does.
    # The meta device stands for a GPU here: the same .to() path, on any machine.
    torch = pytest.importorskip("torch")
    path = writer(tmp_path / "a.safetensors", {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    d = eredu.load_file(path, "pt", device="meta")
    assert d["w"].device.type == "meta" and tuple(d["w"].shape) == (2, 3)
    with eredu.safe_open(path, "pt", device=torch.device("meta")) as f:
        assert f.get_tensor("w").device.type == "meta" and f.get_slice("w")[:1].device.type == "meta"
    assert eredu.load_file(path, "pt", device="cpu")["w"].device.type == "cpu"
    with pytest.raises(eredu.InvalidArgumentError, match="not a device torch knows"):
        eredu.load_file(path, "pt", device="warp-drive")
    with pytest.raises(eredu.InvalidArgumentError, match="numpy arrays live in CPU memory"):
        eredu.load_file(path, "np", device="cuda:0")
