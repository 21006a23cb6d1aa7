# Every tensor of every real checkpoint in ../shared/data/real, read through numpy and torch, has
# the bytes MANIFEST.json's sha256 records — through safe_open, load_file and aload, for single
# files, the sharded directory and its index.
import asyncio
from pathlib import Path

import numpy as np
import pytest

import eredu
from conftest import NP_OF, sha256, tensor_bytes


def safetensors_files(manifest):
    return [f for f in manifest["files"] if f["format"] == "safetensors" and f["valid"]]


def single_files(manifest):
    return [f for f in safetensors_files(manifest) if "sharded" not in f["file"]]


def sharded_digests(manifest):
    return {t["name"]: t["sha256"] for f in safetensors_files(manifest) if "sharded" in f["file"] for t in f["tensors"]}


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_every_tensor_matches_the_manifest_through_safe_open(real_dir, manifest, framework):
    if framework == "pt":
        pytest.importorskip("torch")
    checked = 0
    for entry in single_files(manifest):
        with eredu.safe_open(real_dir / entry["file"], framework, unsupported="raw") as f:
            assert sorted(t["name"] for t in entry["tensors"]) == f.keys()
            for t in entry["tensors"]:
                value = f.get_tensor(t["name"])
                assert sha256(tensor_bytes(value)) == t["sha256"], (entry["file"], t["name"])
                checked += 1
    assert checked > 150


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_every_tensor_matches_the_manifest_through_load_file(real_dir, manifest, framework):
    if framework == "pt":
        pytest.importorskip("torch")
    for entry in single_files(manifest):
        loaded = eredu.load_file(real_dir / entry["file"], framework, unsupported="raw")
        assert {n: sha256(tensor_bytes(v)) for n, v in loaded.items()} == {t["name"]: t["sha256"]
                                                                          for t in entry["tensors"]}, entry["file"]


@pytest.mark.parametrize("where", ["fluxml-sharded", "fluxml-sharded/model.safetensors.index.json"])
@pytest.mark.parametrize("framework", ["np", "pt"])
def test_a_sharded_checkpoint_opens_as_one(real_dir, manifest, where, framework):
    if framework == "pt":
        pytest.importorskip("torch")
    expected = sharded_digests(manifest)
    loaded = eredu.load_file(real_dir / "safetensors" / where, framework, unsupported="raw")
    assert {n: sha256(tensor_bytes(v)) for n, v in loaded.items()} == expected
    with eredu.safe_open(real_dir / "safetensors" / where, framework, unsupported="raw") as f:
        assert len(f.files) == 6 and f.keys() == sorted(expected)
        assert sha256(tensor_bytes(f.get_tensor("float32_357"))) == expected["float32_357"]


def test_aload_matches_the_manifest(real_dir, manifest):
    async def main():
        entries = single_files(manifest)
        results = await asyncio.gather(*(eredu.aload(real_dir / e["file"], "np", unsupported="raw") for e in entries))
        for entry, loaded in zip(entries, results):
            for t in entry["tensors"]:
                assert sha256(tensor_bytes(loaded[t["name"]])) == t["sha256"]
    asyncio.run(main())


def test_numpy_dtypes_and_known_values(real_dir, manifest):
    for entry in single_files(manifest):
        loaded = eredu.load_file(real_dir / entry["file"], "np", unsupported="raw")
        for t in entry["tensors"]:
            a = loaded[t["name"]]
            if t["dtype"] in NP_OF:
                assert a.dtype == np.dtype(NP_OF[t["dtype"]]) and list(a.shape) == t["shape"]
            elif t["dtype"] == "BF16":
                assert a.dtype == np.uint16 and list(a.shape) == t["shape"]  # the bits: numpy has no bfloat16
            else:
                assert a.dtype == np.uint8  # raw bytes, on request
    # Every tensor of hf-samples is [-3, -2, -1, 0, 1, 2] in its dtype.
    for path in sorted((real_dir / "safetensors" / "hf-samples").glob("*.safetensors")):
        for name, a in eredu.load_file(path).items():
            assert np.array_equal(a, np.array([-3, -2, -1, 0, 1, 2]).astype(a.dtype)), (path.name, name)
    # fluxml's numpy file holds arange(n) per tensor.
    for name, a in eredu.load_file(real_dir / "safetensors/fluxml/model.numpy.safetensors").items():
        if a.dtype != np.bool_:
            assert np.array_equal(a.reshape(-1), np.arange(a.size).astype(a.dtype)), name


def test_torch_gets_bfloat16_and_bool(real_dir):
    torch = pytest.importorskip("torch")
    with eredu.safe_open(real_dir / "safetensors/fluxml/model.safetensors", "pt", unsupported="raw") as f:
        assert f.get_tensor("bfloat16_357").dtype == torch.bfloat16
        assert f.get_tensor("bool_357").dtype == torch.bool
        assert f.get_tensor("float8_e4m3fn_357").dtype == torch.uint8  # torch 1.13 has no float8: raw bytes
    assert Path(real_dir / "safetensors/burn/boolean.safetensors").exists()
    b = eredu.load_file(real_dir / "safetensors/burn/boolean.safetensors", "pt")["buffer"]
    assert b.tolist() == [True, False, True]
