# InPlaceModelSlot: one copy of the model, every version written into its storage — by a staged
# swap, or by a patch of only the blocks that differ — while reads are held off; every failure
# leaves each serving byte as it was, and what would wait forever raises instead.
import asyncio
import threading
import time

import numpy as np
import pytest

import eredu
from conftest import write_sidecar as sidecar

SHAPE = (256, 64)
NAMES = ["a.w", "b.w", "c.w"]


def model(writer, path, value, shape=SHAPE, changed=None):
    """Tensors a.w, b.w, c.w filled with value, value+1, value+2; `changed` sets b.w[0, 0]."""
    arrays = {name: np.full(shape, value + i, dtype=np.float32) for i, name in enumerate(NAMES)}
    if changed is not None:
        arrays["b.w"][0, 0] = changed
    return writer(path, arrays)


@pytest.fixture
def files(tmp_path, writer):
    return {
        "a": model(writer, tmp_path / "a.safetensors", 0),
        "a2": model(writer, tmp_path / "a2.safetensors", 0, changed=7),  # one 64-byte block differs
        "b": model(writer, tmp_path / "b.safetensors", 100),
    }


def address(array):
    return array.__array_interface__["data"][0]


def snapshot(slot):
    with slot.read() as w:
        return {k: np.array(w[k]) for k in w}


def test_swap_and_patch_write_into_the_same_storage(files):
    slot = eredu.InPlaceModelSlot(files["a"])
    with slot.read() as w:
        assert w.generation == 1 and w.origin == str(files["a"]) and set(w) == set(NAMES)
        assert w["b.w"][0, 0] == 1 and w["b.w"][0, 1] == 1
        where = {k: address(w[k]) for k in w}
    calls = []
    report = slot.patch_sync(files["a2"], progress=lambda *call: calls.append(call))
    assert report["generation"] == 2 and report["written_bytes"] == 64
    total = 3 * 256 * 64 * 4
    assert calls[-2:] == [(total, total, "read"), (total, total, "done")], calls
    assert report["bytes"] == 3 * 256 * 64 * 4 and report["publish_pause_ns"] >= 0
    with slot.read() as w:
        assert w.generation == 2 and w["b.w"][0, 0] == 7 and w["b.w"][0, 1] == 1
        assert {k: address(w[k]) for k in w} == where  # the same storage, written in place
        with pytest.raises(ValueError):  # the serving storage: a later patch trusts its digests
            w["c.w"][0, 0] = 5
    report = asyncio.run(slot.patch(files["a2"]))  # the same bytes: nothing to write
    assert report["generation"] == 3 and report["written_bytes"] == 0
    report = asyncio.run(slot.swap(files["b"]))  # a staged copy, written in
    assert report["generation"] == 4 and report["written_bytes"] == 0
    with slot.read() as w:
        assert w["c.w"][0, 0] == 102 and {k: address(w[k]) for k in w} == where
    report = slot.patch_sync(files["a"], patch_budget=3 * 256 * 64 * 4 + 4096)  # every byte differs
    assert report["written_bytes"] == 3 * 256 * 64 * 4
    assert all((v == i).all() for i, v in enumerate(snapshot(slot).values()))


def test_an_empty_slot_reads_none_and_patches_nothing(files, tmp_path, writer):
    slot = eredu.InPlaceModelSlot()
    with slot.read() as w:
        assert w is None
    with pytest.raises(eredu.InvalidArgumentError, match="empty|nothing|first"):
        slot.patch_sync(files["a"])
    assert slot.generation == 0
    with pytest.raises(eredu.CanaryError):  # a first version refused leaves the slot empty...
        slot.swap_sync(files["a"], canary=lambda c: False)
    with slot.read() as w:
        assert w is None and slot.generation == 0
    small = model(writer, tmp_path / "small.safetensors", 50, shape=(128, 64))
    slot.swap_sync(small, origin="v1")  # ...so the next one may have other shapes
    with slot.read() as w:
        assert w.origin == "v1" and w["a.w"].shape == (128, 64) and w["c.w"][-1, -1] == 52
    with pytest.raises(eredu.BackendError) as e:  # from now on, they are fixed
        slot.swap_sync(files["a"])
    assert e.value.kind == "bind_shape_mismatch" and slot.generation == 1


def test_a_failed_patch_leaves_every_byte(files, tmp_path, writer):
    slot = eredu.InPlaceModelSlot(files["a"])
    before = snapshot(slot)

    def unchanged():
        assert slot.generation == 1
        after = snapshot(slot)
        assert all((after[k] == before[k]).all() for k in before)

    with pytest.raises(eredu.BudgetError) as e:  # one changed block, and a budget of 16 bytes
        slot.patch_sync(files["a2"], patch_budget=16)
    assert e.value.kind == "exceeds_budget" and e.value.tensor == "b.w"
    unchanged()

    seen = []

    def refuse(candidate):
        seen.append(float(candidate["b.w"][0, 0]))  # the patched model itself
        return False

    with pytest.raises(eredu.CanaryError, match="returned False"):
        slot.patch_sync(files["a2"], canary=refuse)
    assert seen == [7.0]
    unchanged()

    corrupt = model(writer, tmp_path / "corrupt.safetensors", 0, changed=7)
    sidecar(corrupt, corrupt_from=files["a"])  # digests of other bytes
    with pytest.raises(eredu.ChecksumError) as e:
        slot.patch_sync(corrupt, verify=True)
    assert e.value.kind == "checksum_mismatch" and e.value.tensor == "b.w"
    unchanged()

    with pytest.raises(eredu.BackendError) as e:
        slot.patch_sync(model(writer, tmp_path / "shape.safetensors", 0, shape=(128, 64)))
    assert e.value.kind == "bind_shape_mismatch"
    unchanged()

    with pytest.raises(eredu.InvalidArgumentError, match="patch_budget"):
        slot.patch_sync(files["a2"], patch_budget=-1)
    with pytest.raises(eredu.InvalidArgumentError, match="copies its tensors"):
        slot.patch_sync(files["a2"], weights="map")  # its storage is written: never a file's pages
    unchanged()


def test_a_write_waits_for_the_reads_held(files):
    slot = eredu.InPlaceModelSlot(files["a"])
    done = []
    with slot.read() as w:
        swapper = threading.Thread(target=lambda: done.append(slot.swap_sync(files["b"])))
        swapper.start()
        deadline = time.monotonic() + 30
        while slot._native.try_read() is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # until the swap has loaded and waits to write
        assert slot._native.try_read() is None  # new reads wait: the gate is closed
        time.sleep(0.2)
        assert swapper.is_alive() and not done  # it cannot write while this read is held
        assert w.generation == 1 and w["c.w"][0, 0] == 2 and w["c.w"][-1, -1] == 2
    swapper.join(30)
    assert done and done[0]["generation"] == 2 and done[0]["readers_drained_ns"] > 0
    with slot.read() as w:
        assert w["c.w"][0, 0] == 102


def test_what_would_wait_forever_raises(files):
    slot = eredu.InPlaceModelSlot(files["a"])
    with slot.read() as w:
        with slot.read() as inner:  # reads of one thread nest
            assert inner is w
        with pytest.raises(eredu.InvalidArgumentError, match="this thread holds a read"):
            slot.swap_sync(files["b"])
        with pytest.raises(eredu.InvalidArgumentError, match="this thread holds a read"):
            slot.patch_sync(files["a2"])
    assert slot.generation == 1

    async def main():
        holding, release = asyncio.Event(), asyncio.Event()

        async def holder():
            async with slot.read() as w:
                holding.set()
                await release.wait()
                return float(w["a.w"][0, 0])

        task = asyncio.create_task(holder())
        await holding.wait()
        # Another task of this loop may swap: its write waits for the holder, which goes on.
        swap = asyncio.create_task(slot.swap(files["b"]))
        deadline = time.monotonic() + 30
        while slot._native.try_read() is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        with pytest.raises(eredu.InvalidArgumentError, match="another task on this thread"):
            with slot.read():  # would block the loop, and so the holder, for ever
                pass
        waiting = asyncio.create_task(reader())
        await asyncio.sleep(0.1)
        assert not waiting.done() and not swap.done()
        release.set()
        assert await task == 0.0
        report = await swap
        assert report["generation"] == 2 and await waiting == 100.0

        async with slot.read():
            with pytest.raises(eredu.InvalidArgumentError, match="this task holds a read"):
                await slot.patch(files["a"])

    async def reader():
        async with slot.read() as w:
            return float(w["a.w"][0, 0])

    asyncio.run(main())
    assert slot.generation == 2


def test_readers_never_see_a_mix(files):
    slot = eredu.InPlaceModelSlot(files["a"])
    stop = threading.Event()
    seen, bad = set(), []

    def read():
        while not stop.is_set():
            with slot.read() as w:
                first = float(w["a.w"][0, 0])
                values = [float(w[k][i, j]) - n for n, k in enumerate(NAMES) for i, j in ((0, 0), (-1, -1))]
                seen.add(first)
                if any(v != first for v in values):
                    bad.append((w.generation, values))

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(12):
            target = files["b"] if i % 2 == 0 else files["a"]
            report = slot.patch_sync(target, patch_budget=3 * 256 * 64 * 4 + 4096)
            assert report["written_bytes"] == 3 * 256 * 64 * 4
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not bad and seen <= {0.0, 100.0} and slot.generation == 13
