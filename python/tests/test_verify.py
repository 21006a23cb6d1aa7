# verify= on the load paths (load_file, aload, aread, safe_open): bytes checked against the
# digests the checkpoint records (a `<file>.sha256.json` sidecar or "sha256:<tensor>" metadata),
# a mismatch is ChecksumError naming the tensor and nothing is returned; verify=True needs a
# digest for every tensor read; verify=False (the default) reads as before.
import asyncio
import hashlib
import json

import numpy as np
import pytest

import eredu


def arrays():
    rng = np.random.default_rng(7)
    return {
        "embed": rng.standard_normal((512, 128)).astype(np.float32),
        "norm": rng.standard_normal(128).astype(np.float32),
        "ids": np.arange(300, dtype=np.int64),
    }


def digests(tensors):
    return {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in tensors.items()}


@pytest.fixture
def recorded(tmp_path, writer):
    """A checkpoint with a sidecar of its digests, and its arrays."""
    want = arrays()
    path = writer(tmp_path / "model.safetensors", want)
    (tmp_path / "model.safetensors.sha256.json").write_text(json.dumps(digests(want)))
    return path, want


def corrupt(path, tensor_offset_from_end):
    """Flips one byte `tensor_offset_from_end` bytes before the end of the file."""
    with open(path, "r+b") as f:
        f.seek(-tensor_offset_from_end, 2)
        b = f.read(1)
        f.seek(-tensor_offset_from_end, 2)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("verify", [None, True])
def test_verified_loads_deliver_the_recorded_bytes(recorded, verify):
    path, want = recorded
    for kwargs in ({}, {"dtype": "float16"}, {"weights": "map"}):  # kept, cast, mapped
        loaded = eredu.load_file(path, verify=verify, **kwargs)
        for name, array in want.items():
            expected = array.astype(np.float16) if kwargs.get("dtype") and array.dtype == np.float32 else array
            np.testing.assert_array_equal(loaded[name], expected)
    loaded = asyncio.run(eredu.aload(path, verify=verify))
    np.testing.assert_array_equal(loaded["embed"], want["embed"])


@pytest.mark.parametrize("verify", [None, True])
def test_a_corrupt_tensor_fails_the_load_naming_it(recorded, verify):
    path, want = recorded
    corrupt(path, want["ids"].nbytes // 2)  # "ids" is the last tensor in the file
    for kwargs in ({}, {"dtype": "float32"}, {"weights": "map"}):
        with pytest.raises(eredu.ChecksumError) as e:
            eredu.load_file(path, verify=verify, **kwargs)
        assert e.value.kind == "checksum_mismatch"
        assert e.value.tensor == "ids" and "ids" in str(e.value)
    with pytest.raises(eredu.ChecksumError):
        asyncio.run(eredu.aread(path, "ids", verify=verify))
    with eredu.safe_open(path, verify=verify) as f:
        np.testing.assert_array_equal(f.get_tensor("embed"), want["embed"])  # intact tensors still load
        with pytest.raises(eredu.ChecksumError):
            f.get_tensor("ids")
    # Not verifying delivers the file's bytes, corruption included: the default is unchanged.
    loaded = eredu.load_file(path)
    assert not np.array_equal(loaded["ids"], want["ids"])
    assert eredu.load_file(path, verify=False)["ids"].tobytes() == loaded["ids"].tobytes()


def test_a_corrupt_tensor_that_is_cast_fails_too(recorded):
    path, want = recorded
    corrupt(path, want["ids"].nbytes + want["norm"].nbytes // 2)  # inside "norm", a float32 tensor
    with pytest.raises(eredu.ChecksumError, match="norm"):
        eredu.load_file(path, dtype="float16", verify=True)  # its source bytes are hashed, not the f16
    assert eredu.load_file(path, dtype="float16")["norm"].dtype == np.float16


def test_digests_in_the_metadata_are_verified_too(tmp_path, writer):
    want = arrays()
    path = writer(tmp_path / "meta.safetensors", want, {f"sha256:{k}": v for k, v in digests(want).items()})
    np.testing.assert_array_equal(eredu.load_file(path, verify=True)["norm"], want["norm"])
    corrupt(path, want["ids"].nbytes - 3)
    with pytest.raises(eredu.ChecksumError, match="ids"):
        eredu.load_file(path, verify=None)


def test_verify_true_needs_a_digest_for_every_tensor_read(tmp_path, writer, recorded):
    bare = writer(tmp_path / "bare.safetensors", arrays())
    with pytest.raises(eredu.InvalidArgumentError, match="records no checksums"):
        eredu.load_file(bare, verify=True)
    eredu.load_file(bare, verify=None)  # nothing recorded: nothing to check, no error
    path, want = recorded
    partial = tmp_path / "model.safetensors.sha256.json"
    partial.write_text(json.dumps({k: v for k, v in digests(want).items() if k != "norm"}))
    with pytest.raises(eredu.Error, match="norm"):
        eredu.load_file(path, verify=True)
    loaded = eredu.load_file(path, verify=None)  # verifies what it can
    np.testing.assert_array_equal(loaded["norm"], want["norm"])
    with eredu.safe_open(path, verify=True) as f:  # a slice has no digest of its own
        with pytest.raises(eredu.Error, match="embed"):
            f.get_slice("embed")[0:4]


def test_prefetch_verifies_each_unit_before_delivering_it(recorded):
    path, want = recorded
    got = {}
    for unit in eredu.prefetch(path, units=lambda name: name, verify=True):
        got.update(unit.items())
        unit.release()
    np.testing.assert_array_equal(got["embed"], want["embed"])
    corrupt(path, want["ids"].nbytes // 3)
    delivered = []
    with pytest.raises(eredu.ChecksumError, match="ids"):
        for unit in eredu.prefetch(path, units=lambda name: name, verify=None):
            delivered.append(unit.name)
            unit.release()
    assert "ids" not in delivered  # the corrupt unit is never handed out
    assert sorted(u.name for u in eredu.prefetch(path, units=lambda name: name)) == sorted(want)  # default: off


def test_a_bad_verify_value_is_refused(recorded):
    path, _ = recorded
    for call in (lambda: eredu.load_file(path, verify="yes"), lambda: eredu.safe_open(path, verify=1),
                 lambda: eredu.prefetch(path, units=lambda name: name, verify="on")):
        with pytest.raises(eredu.InvalidArgumentError, match="verify"):
            call()


def test_write_checksums_writes_what_eredu_checksum_writes(tmp_path, writer, eredu_cli):
    # One sidecar writer (eredu::app::write_checksums) behind both: byte for byte the same file.
    import shutil
    import subprocess
    want = arrays()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours = writer(tmp_path / "a" / "model.safetensors", want)
    theirs = tmp_path / "b" / "model.safetensors"
    shutil.copyfile(ours, theirs)
    for digest in ("sha256", "both"):
        report = eredu.write_checksums(ours, digest=digest)
        subprocess.run([eredu_cli, "checksum", str(theirs), "--digest", digest, "--quiet"], check=True)
        sidecar = tmp_path / "a" / "model.safetensors.sha256.json"
        assert report["sidecar"] == str(sidecar)
        assert sidecar.read_bytes() == (tmp_path / "b" / "model.safetensors.sha256.json").read_bytes()
    assert report["tensors"] == 3 and report["digests"] == 6  # SHA-256 and XXH3-128 of each
    assert report["verified"] == 3  # the SHA-256 the first call recorded, checked against the file
    assert json.dumps(digests(want)["embed"]) in sidecar.read_text()  # hashlib's SHA-256 of the bytes
    loaded = eredu.load_file(ours, verify=True)  # every tensor has a digest now
    np.testing.assert_array_equal(loaded["embed"], want["embed"])


def test_write_checksums_checks_what_is_recorded_and_writes_nothing_on_a_mismatch(recorded):
    path, want = recorded
    sidecar = path.parent / "model.safetensors.sha256.json"
    before = sidecar.read_bytes()
    corrupt(path, 8)
    with pytest.raises(eredu.ChecksumError):
        eredu.write_checksums(path)
    assert sidecar.read_bytes() == before
    assert not (path.parent / "model.safetensors.sha256.json.tmp").exists()


@pytest.mark.parametrize("digest", ["md5", "", 256])
def test_write_checksums_refuses_an_unknown_digest(recorded, digest):
    path, _ = recorded
    with pytest.raises(eredu.InvalidArgumentError):
        eredu.write_checksums(path, digest=digest)


def test_write_checksums_records_tensor_parallel_shards_as_eredu_checksum_does(tmp_path, writer, eredu_cli):
    # One set of sharding presets (eredu::app) behind both: the moe family divides a Mixtral
    # expert as a dense MLP (w1 by rows, w2 by columns) and keeps the router whole; a --shard
    # rule comes first. Byte for byte the sidecar `eredu checksum --tensor-parallel 2` writes.
    import shutil
    import subprocess
    rng = np.random.default_rng(5)
    layer = "model.layers.0.block_sparse_moe."
    want = {layer + "gate.weight": rng.standard_normal((4, 16), dtype=np.float32),
            layer + "experts.0.w1.weight": rng.standard_normal((32, 16), dtype=np.float32),
            layer + "experts.0.w2.weight": rng.standard_normal((16, 32), dtype=np.float32),
            layer + "experts.1.w3.weight": rng.standard_normal((32, 16), dtype=np.float32)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours = writer(tmp_path / "a" / "model.safetensors", want)
    theirs = tmp_path / "b" / "model.safetensors"
    shutil.copyfile(ours, theirs)
    rule = "*.experts.1.*=replicated"
    report = eredu.write_checksums(ours, tensor_parallel=2, family="moe", shard=[rule])
    subprocess.run([eredu_cli, "checksum", str(theirs), "--tensor-parallel", "2", "--family", "moe", "--shard", rule,
                    "--quiet"], check=True)
    sidecar = tmp_path / "a" / "model.safetensors.sha256.json"
    assert sidecar.read_bytes() == (tmp_path / "b" / "model.safetensors.sha256.json").read_bytes()
    shards = json.loads(sidecar.read_text())["__shards__"]
    assert sorted(shards) == [layer + "experts.0.w1.weight", layer + "experts.0.w2.weight"]
    w1 = want[layer + "experts.0.w1.weight"]
    assert shards[layer + "experts.0.w1.weight"]["[16:32, 0:16]"] == hashlib.sha256(w1[16:].tobytes()).hexdigest()
    assert report["shards"] == 4 and report["tensor_parallel"] == {
        "ranks": 2, "head_dim": 128, "heads": 0, "kv_heads": 0, "dims_from": "no attention tensors",
        "split_tensors": 2, "shards": 4}
    # The llama family (the default) leaves the experts whole.
    assert eredu.write_checksums(ours, tensor_parallel=2)["tensor_parallel"]["split_tensors"] == 0


def test_write_checksums_refuses_bad_sharding_keywords(tmp_path, writer):
    path = writer(tmp_path / "model.safetensors",
                  {"model.layers.0.self_attn.q_proj.weight": np.zeros((8, 8), dtype=np.float32)})
    cases = [
        ({"heads": 2}, "heads: only with tensor_parallel"),
        ({"family": "moe"}, "family: only with tensor_parallel"),
        ({"tensor_parallel": 0}, "tensor_parallel must be from 1 to 4096"),
        ({"tensor_parallel": 2, "family": "mixtral"}, "family must be llama or moe, not 'mixtral'"),
        ({"tensor_parallel": 2, "shard": ["a=diagonal"]}, "shard: 'a=diagonal': SPEC is replicated"),
        ({"tensor_parallel": 2, "shard": "a=row"}, "shard must be a sequence"),
        # Not written by eredu gen: the heads must be given, by the keywords' names.
        ({"tensor_parallel": 2}, r"give heads \(query heads\) or head_dim"),
        ({"tensor_parallel": 2, "heads": 3}, "heads: tensor 'model.layers.0.self_attn.q_proj.weight'"),
    ]
    for keywords, message in cases:
        with pytest.raises(eredu.InvalidArgumentError, match=message):
            eredu.write_checksums(path, **keywords)
    assert not (tmp_path / "model.safetensors.sha256.json").exists()
    report = eredu.write_checksums(path, tensor_parallel=2, heads=2)  # two heads of 4 rows: one per rank
    assert report["tensor_parallel"]["head_dim"] == 4 and report["shards"] == 2
