# Concurrent loads from several Python threads: each gets its own correct tensors, a shared
# safe_open serves them all, and the threads really run at once (the GIL is released).
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import eredu
from eredu import _native


@pytest.fixture
def files(tmp_path, writer):
    out = []
    for k in range(4):
        rng = np.random.default_rng(k)
        arrays = {f"t{i}": rng.standard_normal((64, 257)).astype(np.float32) for i in range(10)}
        out.append((writer(tmp_path / f"m{k}.safetensors", arrays), arrays))
    return out


def test_load_file_from_many_threads(files):
    def work(i):
        path, arrays = files[i % len(files)]
        got = eredu.load_file(path, "np")
        return all(np.array_equal(got[k], arrays[k]) for k in arrays)
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(32)))


def test_one_safe_open_shared_by_many_threads(files):
    torch = pytest.importorskip("torch")
    path, arrays = files[0]
    with eredu.safe_open(path, "pt") as f:
        def work(i):
            name = f"t{i % 10}"
            whole = f.get_tensor(name)
            rows = f.get_slice(name)[i % 64:i % 64 + 3]
            return torch.equal(whole, torch.from_numpy(arrays[name])) and np.array_equal(
                rows.numpy(), arrays[name][i % 64:i % 64 + 3])
        with ThreadPoolExecutor(6) as pool:
            assert all(pool.map(work, range(60)))
        assert f.staging()["in_use"] == 0


def test_a_blocked_load_does_not_hold_the_gil(files):
    # While one thread waits in a load whose reads are held, another thread runs Python code.
    path, arrays = files[1]
    gate = _native._ReadGate()
    result = {}

    def loader():
        result["value"] = eredu.load_file(path, "np", _faults=gate)

    t = threading.Thread(target=loader)
    t.start()
    assert gate.wait_arrivals(1, 20.0)
    counted = sum(1 for _ in range(200000))  # needs the GIL: proves the loader released it
    assert t.is_alive()
    gate.open()
    t.join(30)
    assert counted == 200000 and np.array_equal(result["value"]["t3"], arrays["t3"])
