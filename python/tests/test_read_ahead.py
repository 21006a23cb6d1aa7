# get_tensor's read-ahead (eredu/_read_ahead.py, opt-in with readahead=): a get_tensor loop in
# keys() or offset_keys() order reads the next tensors ahead; the bytes are those load() gives, a random access pattern is
# still served right, close() with reads ahead in flight frees everything, and the staging pool
# never goes above its budget.
import random

import numpy as np
import pytest

import eredu
from conftest import settled_live_bytes


@pytest.fixture
def model(tmp_path, writer):
    rng = np.random.default_rng(11)
    # File order differs from sorted order: the names are written shuffled.
    names = [f"t{i:02d}" for i in range(24)]
    random.Random(3).shuffle(names)
    arrays = {n: rng.standard_normal((32, 256 + 64 * (i % 5))).astype(np.float32) for i, n in enumerate(names)}
    return writer(tmp_path / "m.safetensors", arrays), arrays


def baseline_live():
    return eredu.storage_stats()["live_bytes"]


@pytest.mark.parametrize("order", ["keys", "offset_keys"])
def test_a_sequential_loop_reads_ahead_and_gives_what_load_gives(model, order):
    path, arrays = model
    with eredu.safe_open(path, "np", budget="1M", chunk="128K", readahead="256M") as f:
        whole = f.load()
        names = f.keys() if order == "keys" else f.offset_keys()
        seen_ahead = 0
        got = {}
        for name in names:
            got[name] = f.get_tensor(name)
            seen_ahead = max(seen_ahead, f._ahead.pending()[0])
        assert seen_ahead > 0, "nothing was read ahead"
        assert list(got) == names
        for name in names:
            assert got[name].dtype == whole[name].dtype and np.array_equal(got[name], whole[name])
            assert np.array_equal(got[name], arrays[name])
        assert f.staging()["high_water"] <= f.staging()["budget"]
        assert f._ahead.pending() == (0, 0)  # the last tensor asked for: nothing left ahead


def test_read_ahead_is_bounded(model):
    path, arrays = model
    one = max(a.nbytes for a in arrays.values())
    with eredu.safe_open(path, "np", readahead=2 * one) as f:
        names = f.keys()
        most = 0
        for name in names[:6]:
            f.get_tensor(name)
            tensors, nbytes = f._ahead.pending()
            assert nbytes <= 2 * one
            most = max(most, nbytes)
        assert most > one  # it does read ahead, up to the limit
    with eredu.safe_open(path, "np", readahead=0) as f:  # off
        for name in f.keys()[:6]:
            f.get_tensor(name)
            assert f._ahead.pending() == (0, 0)
    with eredu.safe_open(path, "np") as f:  # on by default, within its 256 MiB
        most = 0
        for name in f.keys()[:6]:
            f.get_tensor(name)
            most = max(most, f._ahead.pending()[1])
        assert 0 < most <= 256 << 20
    with pytest.raises(eredu.InvalidArgumentError, match="readahead"):
        eredu.safe_open(path, "np", readahead=-1)


def test_a_random_access_pattern_is_served_right(model):
    path, arrays = model
    rng = random.Random(7)
    with eredu.safe_open(path, "np", readahead="256M") as f:
        keys = f.keys()
        pattern = keys[:5] + [rng.choice(keys) for _ in range(40)] + keys[3:9] + keys[2:4] + f.offset_keys()[:6]
        for name in pattern:
            assert np.array_equal(f.get_tensor(name), arrays[name]), name
        # A jump out of the order dropped what was read ahead: never more than the window.
        assert f._ahead.pending()[1] <= 256 << 20
        assert f.staging()["high_water"] <= f.staging()["budget"]


def test_close_with_reads_ahead_in_flight_frees_everything(model):
    path, arrays = model
    live = baseline_live()
    f = eredu.safe_open(path, "np", readahead="256M")
    keys = f.keys()
    a = f.get_tensor(keys[0])
    b = f.get_tensor(keys[1])
    assert f._ahead.pending()[0] > 0
    f.close()
    assert f._reader.native.staging()["in_use"] == 0  # every lease back before close returns
    # A cancelled unit's storage is freed on eredu's loop just after the cancellation is reported
    # (docs/reliability.md): it must be gone at once after that, not at some later load.
    assert settled_live_bytes(live + a.nbytes + b.nbytes) == live + a.nbytes + b.nbytes  # only what the caller holds
    del a, b
    assert settled_live_bytes(live) == live


def test_a_failed_read_ahead_fails_the_get_tensor_that_asks_for_it(tmp_path, writer):
    # The third tensor's bytes do not match its recorded digest: reading it ahead must not fail
    # the earlier get_tensor calls, and its own get_tensor raises ChecksumError as without
    # read-ahead.
    from conftest import sha256
    arrays = {f"t{i}": np.full(64, i, dtype=np.float32) for i in range(4)}
    metadata = {f"sha256:{k}": sha256(v.tobytes()) for k, v in arrays.items()}
    metadata["sha256:t2"] = sha256(b"something else")
    path = writer(tmp_path / "bad.safetensors", arrays, metadata=metadata)
    with eredu.safe_open(path, "np", verify=True, readahead="256M") as f:
        assert f.get_tensor("t0")[0] == 0
        assert f.get_tensor("t1")[0] == 1
        with pytest.raises(eredu.ChecksumError):
            f.get_tensor("t2")
        assert f.get_tensor("t3")[0] == 3


def test_names_that_neighbour_in_both_orders_do_not_make_it_drop_its_reads(tmp_path, writer, monkeypatch):
    # File order a, b, z, c, d...: a -> b follows both orders; the loop then goes on in file
    # order. Choosing sorted order at b would read c, d... ahead and drop them at z.
    import eredu._read_ahead as ra
    names = ["a", "b", "z", "c", "d", "e", "f", "g"]
    arrays = {n: np.full(1024, i, dtype=np.float32) for i, n in enumerate(names)}
    path = writer(tmp_path / "o.safetensors", arrays)
    dropped = []
    original = ra.ReadAhead._drop_locked

    def counting(self, keep=None):
        ops = original(self, keep)
        dropped.extend(ops)
        return ops

    monkeypatch.setattr(ra.ReadAhead, "_drop_locked", counting)
    with eredu.safe_open(path, "np", readahead="256M") as f:
        assert f.offset_keys() == names
        ahead = 0
        for n in f.offset_keys():
            assert f.get_tensor(n)[0] == names.index(n)
            ahead = max(ahead, f._ahead.pending()[0])
        assert ahead > 0
        assert dropped == []
