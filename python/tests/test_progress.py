# progress= on Python loads: called from the waiting thread (never eredu's), "read" calls with
# bytes that never decrease, then ("done", total, total) with total the bytes of every tensor
# returned; an exception the callback raises cancels the load with every lease back; the same
# from asyncio. A _ReadGate holds the reads so the load is certainly in flight for a while.
import asyncio
import threading
import time

import numpy as np
import pytest

import eredu
from conftest import settled_live_bytes
import eredu.numpy
from eredu import _native


@pytest.fixture
def model(tmp_path, writer):
    rng = np.random.default_rng(5)
    arrays = {f"w{i:02d}": rng.standard_normal((64, 1024)).astype(np.float32) for i in range(12)}
    return writer(tmp_path / "m.safetensors", arrays), arrays


class Recorder:
    """A progress callback that records its calls and the thread each came from."""

    def __init__(self, fail_on=None):
        self.calls = []
        self.threads = set()
        self.fail_on = fail_on

    def __call__(self, done, total, phase):
        self.calls.append((done, total, phase))
        self.threads.add(threading.get_ident())
        if self.fail_on is not None and self.fail_on(done, total, phase):
            raise RuntimeError("stop the load")


def open_later(gate, delay):
    """Opens `gate` once a read is held there and `delay` seconds have passed."""
    def run():
        assert gate.wait_arrivals(1, 20.0)
        time.sleep(delay)
        gate.open()
    t = threading.Thread(target=run)
    t.start()
    return t


def check_calls(rec, total):
    calls = rec.calls
    assert calls, "the callback was never called"
    done = [c[0] for c in calls]
    assert done == sorted(done), f"bytes went backwards: {done}"
    assert all(c[1] == total for c in calls), calls
    assert [c[2] for c in calls[-2:]] == ["read", "done"]
    assert calls[-1][:2] == (total, total) and calls[-2][:2] == (total, total)
    assert {c[2] for c in calls} == {"read", "done"}
    assert rec.threads == {threading.get_ident()}, "called from a thread other than the waiting one"


def test_load_file_reports_read_then_done_and_the_bytes_of_every_tensor(model):
    path, arrays = model
    total = sum(a.nbytes for a in arrays.values())
    gate = _native._ReadGate()
    rec = Recorder()
    helper = open_later(gate, 0.3)
    out = eredu.load_file(path, _faults=gate, budget="512K", chunk="128K", progress=rec)
    helper.join()
    assert sum(t.nbytes for t in out.values()) == total
    for k, a in arrays.items():
        assert np.array_equal(out[k], a)
    check_calls(rec, total)
    # Held 0.3 s by the gate: the callback ran while the bytes had not all landed, throttled.
    during = [c for c in rec.calls if c[2] == "read" and c[0] < total]
    assert during, rec.calls
    assert len(rec.calls) < 0.3 / 0.05 + 20  # about one call per 50 ms, not one per poll or read


def test_every_load_entry_point_takes_progress(model):
    path, arrays = model
    total = sum(a.nbytes for a in arrays.values())
    for load in (lambda cb: eredu.numpy.load_file(path, progress=cb),
                 lambda cb: eredu.safe_open(path, "np").load(progress=cb),
                 lambda cb: eredu.safe_open(path, "np").get_tensors(progress=cb),
                 lambda cb: eredu.safe_open(path, "np").load(["w03"], progress=cb)):
        rec = Recorder()
        out = load(rec)
        check_calls(rec, sum(t.nbytes for t in out.values()))
    assert rec.calls[-1][1] == arrays["w03"].nbytes
    rec = Recorder()
    assert len(eredu.load_file(path, progress=rec)) == len(arrays)
    check_calls(rec, total)
    for readahead in (0, "256M"):  # read ahead or not, each get_tensor reports its own bytes
        with eredu.safe_open(path, "np", readahead=readahead) as f:
            for name in f.keys():
                rec = Recorder()
                f.get_tensor(name, progress=rec)
                check_calls(rec, arrays[name].nbytes)


def test_torch_load_file_takes_progress(model):
    torch = pytest.importorskip("torch")
    import eredu.torch
    path, arrays = model
    rec = Recorder()
    out = eredu.torch.load_file(path, progress=rec)
    assert isinstance(out["w00"], torch.Tensor)
    check_calls(rec, sum(a.nbytes for a in arrays.values()))


def test_an_exception_from_the_callback_cancels_the_load_with_every_lease_back(model):
    path, _ = model
    gate = _native._ReadGate()
    baseline = eredu.storage_stats()["live_bytes"]
    rec = Recorder(fail_on=lambda done, total, phase: phase == "read")
    with eredu.safe_open(path, "np", _faults=gate, budget="512K", chunk="128K") as f:
        helper = open_later(gate, 0.3)
        with pytest.raises(RuntimeError, match="stop the load"):
            f.load(progress=rec)
        helper.join()
        assert len(rec.calls) == 1  # not called again once it raised
        assert f.staging()["in_use"] == 0
        assert settled_live_bytes(baseline) == baseline  # the cancelled load's storage, freed just after
        assert f.get_tensor("w00").shape == (64, 1024)  # still serving


def test_progress_must_be_callable(model):
    path, _ = model
    with pytest.raises(TypeError, match="progress"):
        eredu.load_file(path, progress=42)


def test_asyncio_loads_report_on_the_loop_thread(model):
    path, arrays = model
    total = sum(a.nbytes for a in arrays.values())

    async def main():
        gate = _native._ReadGate()
        rec = Recorder()
        helper = open_later(gate, 0.3)
        out = await eredu.aload(path, _faults=gate, budget="512K", chunk="128K", progress=rec)
        helper.join()
        assert len(out) == len(arrays)
        check_calls(rec, total)
        assert any(c[0] < total for c in rec.calls if c[2] == "read")
        rec = Recorder()
        with eredu.safe_open(path, "np") as f:
            out = await f.aload(progress=rec)
            check_calls(rec, total)
            rec = Recorder()
            await f.aget_tensor("w01", progress=rec)
            check_calls(rec, arrays["w01"].nbytes)
        rec = Recorder()
        await eredu.aread(path, "w02", progress=rec)
        check_calls(rec, arrays["w02"].nbytes)
        rec = Recorder()
        part = await eredu.aread(path, "w02", index=(slice(0, 4),), progress=rec)
        check_calls(rec, part.nbytes)

    asyncio.run(main())


def test_asyncio_callback_exception_cancels_with_every_lease_back(model):
    path, _ = model

    async def main():
        gate = _native._ReadGate()
        rec = Recorder(fail_on=lambda done, total, phase: True)
        with eredu.safe_open(path, "np", _faults=gate, budget="512K", chunk="128K") as f:
            helper = open_later(gate, 0.3)
            with pytest.raises(RuntimeError, match="stop the load"):
                await f.aload(progress=rec)
            helper.join()
            assert len(rec.calls) == 1
            assert f.staging()["in_use"] == 0

    asyncio.run(main())


def test_prefetch_reports_the_units_delivered(model):
    path, arrays = model
    per_pass = sum(a.nbytes for a in arrays.values())
    rec = Recorder()
    seen = 0
    with eredu.prefetch(path, units=lambda name: name[:2], lookahead=1, passes=2, progress=rec) as p:
        for unit in p:
            seen += sum(t.nbytes for t in unit.values())
    assert seen == 2 * per_pass
    check_calls(rec, 2 * per_pass)
    assert rec.calls[-1] == (2 * per_pass, 2 * per_pass, "done")


def test_prefetch_callback_exception_closes_the_pipeline(model):
    path, _ = model
    rec = Recorder(fail_on=lambda done, total, phase: True)
    p = eredu.prefetch(path, units=lambda name: name, lookahead=2, progress=rec)
    with pytest.raises(RuntimeError, match="stop the load"):
        next(p)
    with pytest.raises(StopIteration):
        next(p)  # closed: nothing more is delivered
    p.close()


def test_model_slot_swaps_report_progress(model, tmp_path, writer):
    path, arrays = model
    total = sum(a.nbytes for a in arrays.values())
    slot = eredu.ModelSlot()
    rec = Recorder()
    slot.swap_sync(path, progress=rec)
    check_calls(rec, total)
    v2 = writer(tmp_path / "v2.safetensors", {k: a + 1 for k, a in arrays.items()})

    async def main():
        rec = Recorder()
        await slot.swap(v2, progress=rec)
        check_calls(rec, total)
        assert slot.generation == 2
        rec = Recorder(fail_on=lambda done, total, phase: phase == "done")
        with pytest.raises(RuntimeError):
            await slot.swap(path, progress=rec)  # raised after publishing: the swap stands

    asyncio.run(main())
    assert np.array_equal(slot.current()["w00"], arrays["w00"])
