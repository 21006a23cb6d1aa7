"""Checkpoints behind a URL from Python (docs/remote.md): nginx serves a directory on loopback,
started by the test (tests/remote/servers/nginx.py); each test skips with the reason when it
cannot start."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import eredu
import eredu.numpy

SERVERS = Path(__file__).resolve().parents[2] / "tests" / "remote" / "servers"


@pytest.fixture
def served(tmp_path):
    """(directory served, base URL)."""
    root = tmp_path / "served"
    root.mkdir()
    proc = subprocess.Popen([sys.executable, str(SERVERS / "nginx.py"), "--root", str(root)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("READY "):
        proc.wait(10)
        pytest.skip(f"nginx did not start: {line or 'no output'}")
    yield root, line.split()[1]
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(10)


def test_load_file_over_http_equals_the_local_file(served, llama_like):
    root, base = served
    path, arrays = llama_like
    (root / "m.safetensors").write_bytes(Path(path).read_bytes())
    got = eredu.numpy.load_file(f"{base}/m.safetensors", part_size="4K", connections=4)
    assert sorted(got) == sorted(arrays)
    for name, a in arrays.items():
        np.testing.assert_array_equal(got[name], a)


def test_safe_open_over_http_reads_slices_and_metadata(served, llama_like):
    root, base = served
    path, arrays = llama_like
    (root / "m.safetensors").write_bytes(Path(path).read_bytes())
    with eredu.safe_open(f"{base}/m.safetensors", framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        assert sorted(f.keys()) == sorted(arrays)
        np.testing.assert_array_equal(f.get_slice("lm_head.weight")[3:9], arrays["lm_head.weight"][3:9])


def test_a_missing_object_is_remote_not_found_and_a_file_not_found_error(served):
    _, base = served
    with pytest.raises(FileNotFoundError) as e:
        eredu.numpy.load_file(f"{base}/missing.safetensors")
    assert isinstance(e.value, eredu.RemoteNotFoundError)
    assert e.value.kind == "remote_not_found"
    assert "missing.safetensors" in str(e.value)


def test_cache_keeps_the_object_and_a_second_load_reads_it_locally(served, llama_like, tmp_path):
    root, base = served
    path, arrays = llama_like
    (root / "m.safetensors").write_bytes(Path(path).read_bytes())
    cache = tmp_path / "cache"
    for _ in range(2):
        got = eredu.numpy.load_file(f"{base}/m.safetensors", cache=str(cache))
        np.testing.assert_array_equal(got["lm_head.weight"], arrays["lm_head.weight"])
    copies = [p for p in cache.rglob("*") if p.is_file() and p.read_bytes() == Path(path).read_bytes()]
    assert len(copies) == 1


def test_remote_options_are_validated():
    with pytest.raises(eredu.InvalidArgumentError):
        eredu.numpy.load_file("http://127.0.0.1:9/m.safetensors", connections=0)
    with pytest.raises(eredu.InvalidArgumentError):
        eredu.numpy.load_file("http://127.0.0.1:9/m.safetensors", s3_addressing="sideways")


def test_the_eredu_command_loads_a_url(served, eredu_cli, llama_like):
    root, base = served
    path, _ = llama_like
    (root / "m.safetensors").write_bytes(Path(path).read_bytes())
    r = subprocess.run([eredu_cli, "load", f"{base}/m.safetensors", "--json", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["tensor_count"] == 15 and report["path"].startswith("http://127.0.0.1:")
    r = subprocess.run([eredu_cli, "load", f"{base}/nothing.safetensors"], capture_output=True, text=True)
    assert r.returncode != 0
    assert "remote_not_found" in r.stderr


def test_prefetch_streams_layers_from_a_url(served, llama_like):
    root, base = served
    path, arrays = llama_like
    (root / "m.safetensors").write_bytes(Path(path).read_bytes())
    with eredu.prefetch(f"{base}/m.safetensors", lookahead=2) as p:
        assert p.units == [f"model.layers.{i}" for i in range(4)]
        for unit in p:
            for k, v in unit.items():
                np.testing.assert_array_equal(v, arrays[k])


def test_a_model_slot_swaps_to_a_url_and_a_failed_swap_keeps_the_old_version(served, llama_like, tmp_path):
    root, base = served
    path, arrays = llama_like
    (root / "m.safetensors").write_bytes(Path(path).read_bytes())
    slot = eredu.ModelSlot(path)
    report = slot.swap_sync(f"{base}/m.safetensors")
    assert report["generation"] == 2 and slot.current().origin == f"{base}/m.safetensors"
    np.testing.assert_array_equal(slot.current()["lm_head.weight"], arrays["lm_head.weight"])
    with pytest.raises(eredu.RemoteNotFoundError):
        slot.swap_sync(f"{base}/gone.safetensors")
    assert slot.generation == 2  # the URL's version keeps serving
