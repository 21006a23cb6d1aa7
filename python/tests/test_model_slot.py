# ModelSlot: wait-free current(), swaps that publish a whole new version, and every failure —
# load, shape, missing or extra tensor, checksum, canary, cancellation — leaving the old version
# serving; versions stay consistent for readers on other threads.
import asyncio
import threading

import numpy as np
import pytest

import eredu
from conftest import write_sidecar as sidecar
from eredu import _native


def model(writer, path, value, shape=(256, 64), extra=None, drop=None):
    arrays = {name: np.full(shape, value + i, dtype=np.float32) for i, name in enumerate(["a.w", "b.w", "c.w"])}
    if drop:
        arrays.pop(drop)
    if extra:
        arrays[extra] = np.zeros(4, np.float32)
    return writer(path, arrays)


@pytest.fixture
def two(tmp_path, writer):
    return model(writer, tmp_path / "a.safetensors", 0), model(writer, tmp_path / "b.safetensors", 100)


def test_swaps_publish_whole_versions(two):
    a, b = two
    slot = eredu.ModelSlot(a)
    v1 = slot.current()
    assert slot.generation == 1 and v1.generation == 1 and v1.origin == str(a)
    assert set(v1) == {"a.w", "b.w", "c.w"} and v1["b.w"][0, 0] == 1
    assert slot.current() is v1  # cached: current() does not rebuild the mapping per request
    report = asyncio.run(slot.swap(b))
    assert report["generation"] == 2 and report["bytes"] == 3 * 256 * 64 * 4 and report["publish_pause_ns"] >= 0
    v2 = slot.current()
    assert v2.generation == 2 and v2["c.w"][0, 0] == 102
    assert v1["c.w"][0, 0] == 2  # the old version is unchanged while held


def test_an_empty_slot(two):
    a, _ = two
    slot = eredu.ModelSlot()
    assert slot.current() is None and slot.generation == 0
    slot.swap_sync(a, origin="v1")
    assert slot.current().origin == "v1"


@pytest.mark.parametrize("case, error, kind", [
    ("shape", eredu.BackendError, "bind_shape_mismatch"),
    ("missing", eredu.TensorNotFoundError, "tensor_not_found"),
    ("extra", eredu.OrchestrationError, "unexpected_bindings"),
    ("absent", eredu.IoError, "io_error"),
])
def test_a_failed_swap_leaves_the_old_version_serving(two, tmp_path, writer, case, error, kind):
    a, _ = two
    slot = eredu.ModelSlot(a)
    bad = tmp_path / "bad.safetensors"
    if case == "shape":
        model(writer, bad, 5, shape=(128, 64))
    elif case == "missing":
        model(writer, bad, 5, drop="b.w")
    elif case == "extra":
        model(writer, bad, 5, extra="d.w")
    with pytest.raises(error) as e:
        slot.swap_sync(bad)
    assert e.value.kind == kind
    assert slot.generation == 1 and slot.current()["a.w"][0, 0] == 0


def test_checksums_are_verified_before_publication(two, tmp_path, writer):
    a, b = two
    sidecar(a)
    slot = eredu.ModelSlot(a, verify=True)
    report = slot.swap_sync(a, verify=True)
    assert report["verified_bytes"] == 3 * 256 * 64 * 4
    corrupt = model(writer, tmp_path / "corrupt.safetensors", 0)
    data = bytearray(corrupt.read_bytes())
    data[-5] ^= 0xFF  # one byte of c.w, the file still well formed
    corrupt.write_bytes(bytes(data))
    sidecar(corrupt, corrupt_from=a)  # the digests of the true bytes
    with pytest.raises(eredu.ChecksumError) as e:
        slot.swap_sync(corrupt)
    assert e.value.kind == "checksum_mismatch" and e.value.tensor == "c.w"
    assert slot.generation == 2
    with pytest.raises(eredu.InvalidArgumentError, match="records no checksums"):
        slot.swap_sync(b, verify=True)
    slot.swap_sync(b, verify=False)
    assert slot.generation == 3


def test_the_canary_decides(two):
    a, b = two
    slot = eredu.ModelSlot(a)
    seen = []

    def reject(candidate):
        seen.append(candidate["a.w"][0, 0])
        raise ValueError("output is off")
    with pytest.raises(eredu.CanaryError) as e:
        slot.swap_sync(b, canary=reject)
    assert seen == [100] and "ValueError: output is off" in str(e.value)
    assert isinstance(e.value.__cause__, ValueError) and slot.generation == 1
    with pytest.raises(eredu.CanaryError, match="returned False"):
        slot.swap_sync(b, canary=lambda c: False)
    slot.swap_sync(b, canary=lambda c: c["a.w"][0, 0] == 100)
    assert slot.generation == 2


def test_an_async_canary_runs_on_the_awaiting_loop(two):
    a, b = two
    slot = eredu.ModelSlot(a)

    async def main():
        loop = asyncio.get_running_loop()
        where = []

        async def canary(candidate):
            where.append(asyncio.get_running_loop() is loop)
            await asyncio.sleep(0.01)
            return candidate["b.w"][0, 0] == 101

        report = await slot.swap(b, canary=canary)
        with pytest.raises(eredu.CanaryError):
            await slot.swap(a, canary=lambda c: 1 / 0)
        return report, where
    report, where = asyncio.run(main())
    assert report["generation"] == 2 and where == [True] and slot.current()["b.w"][0, 0] == 101


def test_cancelling_a_swap_keeps_the_old_version(two):
    a, b = two
    slot = eredu.ModelSlot(a)
    gate = _native._ReadGate()  # holds the swap's reads

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(slot.swap(b, _faults=gate))
        assert await loop.run_in_executor(None, gate.wait_arrivals, 1, 20.0)
        task.cancel()
        # Let the task run its cancellation (the bridge posts it to eredu's loop) before the
        # reads go on: their completions then reach that loop after it, and the swap stops
        # before publication. (A cancellation that comes after the publication is not one:
        # the task then returns the swap's report.)
        for _ in range(3):
            await asyncio.sleep(0)
        gate.open()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    assert slot.generation == 1 and slot.current()["a.w"][0, 0] == 0 and not slot.swapping


def test_readers_on_other_threads_see_whole_versions(two):
    a, b = two
    slot = eredu.ModelSlot(a)
    stop = threading.Event()
    bad = []

    def reader():
        while not stop.is_set():
            v = slot.current()
            base = v["a.w"][0, 0]
            if not (v["b.w"][-1, -1] == base + 1 and v["c.w"][7, 3] == base + 2 and base in (0, 100)):
                bad.append((v.generation, base))
    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(6):
        slot.swap_sync(b if i % 2 == 0 else a)
    stop.set()
    for t in threads:
        t.join()
    assert not bad and slot.generation == 7
    assert slot.storage()["live_bytes"] <= 2 * 3 * 256 * 64 * 4 + 3 * 4096


def test_a_torch_slot_imports_torch_before_its_first_swap():
    # The first swap's canary_s would otherwise time torch's import (seconds on a cold start).
    pytest.importorskip("torch", reason="a framework='pt' slot needs torch")
    import subprocess
    import sys
    code = "import sys, eredu; eredu.ModelSlot(framework='pt'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
