# asyncio: aload/aread/aget_tensor bridge eredu's completions to the running loop without
# blocking it; cancelling the task cancels the load, returns every lease, frees its tensors and
# raises asyncio.CancelledError. A read gate (a test hook that holds reads in flight) makes the
# moment of cancellation certain.
import asyncio
import gc

import numpy as np
import pytest

import eredu
from eredu import _native
from conftest import bf16_bits, bf16_to_f32, settled_live_bytes


@pytest.fixture
def bf16_model(tmp_path, writer):
    rng = np.random.default_rng(5)
    bits = {f"w{i}": bf16_bits(rng.standard_normal((256, 1024))) for i in range(6)}
    path = writer(tmp_path / "bf16.safetensors", {k: ("BF16", list(v.shape), v.tobytes()) for k, v in bits.items()})
    return path, bits


def run(coro):
    return asyncio.run(coro)


def test_aload_equals_load_file(bf16_model):
    path, bits = bf16_model
    got = run(eredu.aload(path, "np"))
    assert list(got) == list(bits) and all(np.array_equal(got[k], bits[k]) for k in bits)
    got = run(eredu.aload(path, "np", bf16="float32", names=["w2"]))
    assert list(got) == ["w2"] and np.array_equal(got["w2"], bf16_to_f32(bits["w2"]))


def test_many_loads_at_once(bf16_model, llama_like):
    path, bits = bf16_model
    lpath, arrays = llama_like

    async def main():
        return await asyncio.gather(eredu.aload(path), eredu.aload(lpath), eredu.aread(lpath, "lm_head.weight"),
                                    eredu.aload(path, bf16="float32"))
    a, b, c, d = run(main())
    assert np.array_equal(a["w5"], bits["w5"]) and np.array_equal(c, arrays["lm_head.weight"])
    assert all(np.array_equal(b[k], arrays[k]) for k in arrays) and d["w0"].dtype == np.float32


def test_the_event_loop_keeps_running_while_eredu_loads(bf16_model):
    path, bits = bf16_model
    gate = _native._ReadGate()

    async def main():
        loop = asyncio.get_running_loop()
        f = eredu.safe_open(path, "np", _faults=gate)
        load = asyncio.create_task(f.aload())
        assert await loop.run_in_executor(None, gate.wait_arrivals, 1, 20.0)
        ticks = 0
        for _ in range(20):  # the loop is free while reads are held
            await asyncio.sleep(0.001)
            ticks += 1
        assert not load.done()
        gate.open()
        got = await load
        f.close()
        return ticks, got
    ticks, got = run(main())
    assert ticks == 20 and np.array_equal(got["w3"], bits["w3"])


@pytest.mark.parametrize("cast", [None, "float32"])
def test_cancelling_the_task_cancels_the_load_and_returns_every_lease(bf16_model, cast):
    path, _ = bf16_model
    gate = _native._ReadGate()
    baseline = eredu.storage_stats()["live_bytes"]

    async def main():
        loop = asyncio.get_running_loop()
        # A cast reads through chunk leases, so leases are certainly held when the cancel lands.
        with eredu.safe_open(path, "np", dtype=cast, _faults=gate, budget="1M", chunk="256K") as f:
            load = asyncio.create_task(f.aload())
            assert await loop.run_in_executor(None, gate.wait_arrivals, 1, 20.0)
            held = f.staging()["in_use"]
            load.cancel()
            await asyncio.sleep(0.01)
            assert not load.done()  # the task waits for the load to stop: reads are still held
            gate.open()
            with pytest.raises(asyncio.CancelledError):
                await load
            assert load.cancelled()
            staging = f.staging()
            again = await f.aget_tensor("w1")  # the checkpoint still serves
        return held, staging, again
    held, staging, again = run(main())
    if cast:
        assert held > 0
    assert staging["in_use"] == 0 and staging["waiting"] == 0
    gc.collect()
    del again
    assert settled_live_bytes(baseline) == baseline  # the cancelled load's storage, freed just after


def test_a_load_cancelled_while_it_waits_for_staging(bf16_model):
    # Two casts share a staging budget of one chunk: the second waits for memory. Cancelled, it
    # stops (the engine stops a realization at its next step: here, once memory frees) with
    # CancelledError, and the first load completes normally.
    path, bits = bf16_model
    gate = _native._ReadGate()

    async def main():
        loop = asyncio.get_running_loop()
        with eredu.safe_open(path, "np", bf16="float32", _faults=gate, budget="256K", chunk="256K") as f:
            first = asyncio.create_task(f.aget_tensor("w0"))
            assert await loop.run_in_executor(None, gate.wait_arrivals, 1, 20.0)
            second = asyncio.create_task(f.aget_tensor("w1"))
            while f.staging()["waiting"] == 0:
                await asyncio.sleep(0.001)
            second.cancel()
            # Let the task run its cancellation (which asks eredu to stop) before the gate opens:
            # opened first, the first load's memory could reach the second and complete it
            # before the stop does, and a load that completed is returned, not cancelled.
            for _ in range(3):
                await asyncio.sleep(0)
            gate.open()
            with pytest.raises(asyncio.CancelledError):
                await second
            w0 = await first
            return w0, f.staging()
    w0, staging = run(main())
    assert np.array_equal(w0, bf16_to_f32(bits["w0"])) and staging["in_use"] == 0


def test_an_error_in_an_awaited_load_is_raised_in_the_task(tmp_path, bf16_model):
    path, _ = bf16_model

    async def main():
        with pytest.raises(eredu.IoError):
            await eredu.aload(tmp_path / "missing.safetensors")
        with pytest.raises(eredu.TensorNotFoundError):
            await eredu.aread(path, "nope")
        with pytest.raises(eredu.SelectionError):
            await eredu.aread(path, "w0", index=(slice(0, 2, 2),))
        return await eredu.aread(path, "w0", index=(0, slice(0, 4)))
    assert run(main()).shape == (4,)
