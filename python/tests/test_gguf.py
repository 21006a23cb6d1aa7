# GGUF through the Python module, on ggml's own fixtures (../shared/data/gguf-quant): every
# quantized type loads dequantized to exactly ggml's f32 (and to bf16 rounded once from it),
# as raw blocks byte for byte, through load_file and safe_open; a quantized tensor numpy cannot
# hold is refused with a typed error naming the file and the tensor.
import json
import os
from pathlib import Path

import numpy as np
import pytest

import eredu
from conftest import REPO, bf16_bits, sha256, tensor_bytes


@pytest.fixture(scope="module")
def quant_dir():
    d = Path(os.environ.get("EREDU_SHARED_DATA_DIR", REPO.parent / "shared" / "data")) / "gguf-quant"
    if not (d / "MANIFEST.json").is_file():
        pytest.skip("no ../shared/data/gguf-quant (EREDU_SHARED_DATA_DIR): skipping")
    return d


def manifest(d, name):
    return json.loads((d / "MANIFEST.json").read_text())["files"][name]["tensors"]


def quantized(entry):
    return entry["ggml_type"] not in ("F32", "F16", "BF16")


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_every_type_dequantizes_to_ggml_f32(quant_dir, framework):
    got = eredu.load_file(quant_dir / "quant-types.gguf", framework=framework, dtype="float32")
    entries = manifest(quant_dir, "quant-types.gguf")
    assert sorted(got) == sorted(t["name"] for t in entries)
    assert sum(quantized(t) for t in entries) == 22
    for t in entries:
        assert list(got[t["name"]].shape) == t["shape_row_major"], t["name"]
        assert sha256(tensor_bytes(got[t["name"]])) == t["dequant_f32_sha256"], t["name"]


def test_bf16_is_ggml_f32_rounded_once(quant_dir):
    import torch
    f32 = eredu.load_file(quant_dir / "quant-types.gguf", dtype="float32")
    bf16 = eredu.load_file(quant_dir / "quant-types.gguf", framework="pt", dtype="bfloat16")
    for name, t in bf16.items():
        assert t.dtype == torch.bfloat16, name
        assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), bf16_bits(f32[name])), name


def test_raw_blocks_are_the_files_bytes(quant_dir):
    raw = eredu.load_file(quant_dir / "quant-types.gguf", unsupported="raw")
    for t in manifest(quant_dir, "quant-types.gguf"):
        if quantized(t):
            a = raw[t["name"]]
            assert a.dtype == np.uint8 and a.nbytes == t["nbytes"], t["name"]
            assert sha256(a.tobytes()) == t["sha256"], t["name"]


def test_safe_open_reads_gguf_metadata_and_tensors(quant_dir):
    path = quant_dir / "tiny-llama-q4_k_m.gguf"
    entries = {t["name"]: t for t in manifest(quant_dir, "tiny-llama-q4_k_m.gguf")}
    with eredu.safe_open(path, framework="np", dtype="float32") as f:
        assert sorted(f.keys()) == sorted(entries)
        assert f.metadata()["general.architecture"] == "llama"
        for name in ("blk.0.attn_q.weight", "blk.3.ffn_down.weight", "output.weight"):
            assert sha256(f.get_tensor(name).tobytes()) == entries[name]["dequant_f32_sha256"], name


def test_a_quantized_tensor_numpy_cannot_hold_is_refused_by_name(quant_dir):
    path = quant_dir / "quant-types.gguf"
    with pytest.raises(eredu.UnsupportedDTypeError) as e:
        eredu.load_file(path)
    assert e.value.kind == "unsupported_dtype" and e.value.tensor.startswith("quant.q")
    assert e.value.file == str(path) and "unsupported='raw'" in str(e.value)
