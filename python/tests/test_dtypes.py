# The dtype rules: bf16 for torch, a uint16 view or float32 for numpy, casts on load, types a
# framework cannot hold refused (or their raw bytes on request), never reinterpreted silently.
import numpy as np
import pytest

import eredu
from conftest import bf16_bits, bf16_to_f32


def e4m3_to_f32(b):
    """The OCP FP8 E4M3 (fn: no infinities, 0x7F/0xFF NaN) value of byte b."""
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 0xF and m == 7:
        return np.nan
    if e == 0:
        return s * m / 8 * 2.0 ** -6
    return s * (1 + m / 8) * 2.0 ** (e - 7)


@pytest.fixture
def mixed(tmp_path, writer):
    rng = np.random.default_rng(11)
    f32 = rng.standard_normal((4, 6)).astype(np.float32)
    bf16 = bf16_bits(f32)
    f16 = f32.astype(np.float16)
    fp8 = np.array([0x00, 0x01, 0x08, 0x38, 0x40, 0x7E, 0x80, 0xB8, 0xC4, 0x7F, 0x22, 0x5A], dtype=np.uint8)
    tensors = {
        "bf16": ("BF16", [4, 6], bf16.tobytes()),
        "f16": f16,
        "f32": f32,
        "fp8": ("F8_E4M3", [3, 4], fp8.tobytes()),
        "f4": ("F4", [4, 6], bytes(range(12))),
        "u16": np.arange(10, dtype=np.uint16),
        "bool": np.array([True, False, True, True]),
        "c64": (np.arange(3) + 1j * np.arange(3)).astype(np.complex64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(7, dtype=np.int64),
        "ids": np.arange(6, dtype=np.int32),
    }
    return writer(tmp_path / "mixed.safetensors", tensors), dict(f32=f32, bf16=bf16, f16=f16, fp8=fp8)


def test_numpy_gets_bf16_bits_by_default_or_float32_on_request(mixed):
    path, v = mixed
    with eredu.safe_open(path, "np") as f:
        bits = f.get_tensor("bf16")
        assert bits.dtype == np.uint16 and np.array_equal(bits, v["bf16"])
    with eredu.safe_open(path, "np", bf16="float32") as f:
        wide = f.get_tensor("bf16")
        assert wide.dtype == np.float32 and np.array_equal(wide.view(np.uint32), bf16_to_f32(v["bf16"]).view(np.uint32))
        assert f.get_tensor("f16").dtype == np.float16  # bf16= concerns BF16 only


def test_torch_gets_bfloat16(mixed):
    torch = pytest.importorskip("torch")
    path, v = mixed
    t = eredu.load_file(path, "pt", unsupported="raw")["bf16"]
    assert t.dtype == torch.bfloat16
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), v["bf16"])


def test_dtype_casts_float_tensors_on_load(mixed):
    torch = pytest.importorskip("torch")
    path, v = mixed
    d = eredu.load_file(path, "pt", dtype=torch.float32, unsupported="raw")
    assert d["bf16"].dtype == torch.float32 and np.array_equal(d["bf16"].numpy(), bf16_to_f32(v["bf16"]))
    assert d["f16"].dtype == torch.float32 and np.array_equal(d["f16"].numpy(), v["f16"].astype(np.float32))
    assert d["ids"].dtype == torch.int32 and d["bool"].dtype == torch.bool  # integers and bool keep theirs
    want = np.array([e4m3_to_f32(b) for b in v["fp8"]], dtype=np.float32).reshape(3, 4)
    assert np.array_equal(d["fp8"].numpy(), want, equal_nan=True)  # F8 -> F32 is one of eredu's casts
    # Narrowing rounds to nearest even, as torch does.
    d = eredu.load_file(path, "pt", dtype="bfloat16", unsupported="raw")
    assert d["f32"].dtype == torch.bfloat16
    assert torch.equal(d["f32"], torch.from_numpy(v["f32"]).to(torch.bfloat16))
    assert torch.equal(d["f16"], torch.from_numpy(v["f16"]).to(torch.bfloat16))
    d = eredu.load_file(path, "np", dtype=np.float16, unsupported="raw")
    assert d["f32"].dtype == np.float16 and np.array_equal(d["f32"], v["f32"].astype(np.float16))


@pytest.mark.parametrize("name, target", [("keep", None), ("KEEP", None), ("fp16", np.float16), ("F16", np.float16),
                                          ("half", np.float16), ("float32", np.float32), ("FP32", np.float32),
                                          ("float", np.float32)])
def test_dtype_names_are_the_clis(mixed, name, target):
    path, v = mixed
    d = eredu.load_file(path, "np", dtype=name, unsupported="raw")
    assert d["f32"].dtype == (target or np.float32) and d["f16"].dtype == (target or np.float16)
    names = dict(eredu._native.cast_choices())
    assert {"keep", "bf16", "f16", "fp16", "float16", "half", "f32", "fp32", "float32", "float", "bfloat16"} == set(names)


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_types_a_framework_cannot_hold_are_refused_before_loading(mixed, framework):
    if framework == "pt":
        pytest.importorskip("torch")
    path, _ = mixed
    with pytest.raises(eredu.UnsupportedDTypeError) as e:
        eredu.load_file(path, framework)
    assert e.value.kind == "unsupported_dtype" and isinstance(e.value, TypeError)
    assert "unsupported='raw'" in str(e.value) and e.value.tensor in ("fp8", "f4", "u16")
    with eredu.safe_open(path, framework) as f:
        with pytest.raises(eredu.UnsupportedDTypeError, match="dtype='float32' to convert it"):
            f.get_tensor("fp8")
        with pytest.raises(eredu.UnsupportedDTypeError) as e:
            f.get_tensor("f4")
        assert "dtype='float32'" not in str(e.value)  # F4 has no cast


def test_raw_views_are_the_bytes(mixed):
    path, v = mixed
    with eredu.safe_open(path, "np", unsupported="raw") as f:
        fp8 = f.get_tensor("fp8")
        assert fp8.dtype == np.uint8 and fp8.shape == (3, 4) and np.array_equal(fp8.reshape(-1), v["fp8"])
        f4 = f.get_tensor("f4")
        assert f4.dtype == np.uint8 and f4.shape == (12,) and f4.tobytes() == bytes(range(12))


def test_torch_raw_for_unsigned_types_it_lacks(mixed):
    torch = pytest.importorskip("torch")
    path, _ = mixed
    with eredu.safe_open(path, "pt", unsupported="raw") as f:
        u16 = f.get_tensor("u16")
        if hasattr(torch, "uint16"):
            assert u16.dtype == torch.uint16
        else:
            assert u16.dtype == torch.uint8 and u16.shape == (20,)  # raw: the last dim widened by 2
            assert np.array_equal(u16.numpy().view(np.uint16), np.arange(10))


def test_bool_complex_empty_and_scalars(mixed):
    path, _ = mixed
    with eredu.safe_open(path, "np", unsupported="raw") as f:
        b = f.get_tensor("bool")
        assert b.dtype == np.bool_ and b.tolist() == [True, False, True, True]
        c = f.get_tensor("c64")
        assert c.dtype == np.complex64 and np.array_equal(c, np.arange(3) + 1j * np.arange(3))
        e = f.get_tensor("empty")
        assert e.shape == (0, 3) and e.dtype == np.float32
        s = f.get_tensor("scalar")
        assert s.shape == () and s == 7


def test_an_unsupported_cast_is_typed(tmp_path, writer):
    path = writer(tmp_path / "fnuz.safetensors", {"w": ("F8_E4M3FNUZ", [2], b"\x01\x02")})
    with pytest.raises(eredu.UnsupportedDTypeError):
        eredu.load_file(path, "np", dtype="float32")  # no FNUZ cast: the dtype stays, numpy cannot hold it
    assert eredu.load_file(path, "np", dtype="float32", unsupported="raw")["w"].tolist() == [1, 2]
