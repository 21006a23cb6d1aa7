# Lifetimes: tensors own their storage (zero-copy DLPack exports), outlive their safe_open, their
# pipeline and their slot version; dropping them gives the storage back.
import gc

import numpy as np
import pytest

import eredu
from eredu import _native
from eredu._options import open_options
from conftest import rss_bytes


@pytest.fixture
def big(tmp_path, writer):
    arrays = {"a": np.arange(1 << 22, dtype=np.float32), "b": np.full((1 << 10, 1 << 10), 3, dtype=np.int32)}
    return writer(tmp_path / "big.safetensors", arrays), arrays


def test_a_tensor_outlives_its_safe_open(big):
    path, arrays = big
    f = eredu.safe_open(path, "np")
    a = f.get_tensor("a")
    f.close()
    del f
    gc.collect()
    assert np.array_equal(a, arrays["a"])


def test_torch_tensors_outlive_everything_and_share_the_loaded_storage(big):
    torch = pytest.importorskip("torch")
    path, arrays = big
    ck = _native.open(str(path), open_options(str(path), {})).wait()
    exported = ck.read([{"key": "a", "view": "stored"}]).wait()[0]
    t1 = torch.utils.dlpack.from_dlpack(exported)
    t2 = torch.utils.dlpack.from_dlpack(exported)
    assert t1.data_ptr() == exported.data_ptr == t2.data_ptr()  # no copy: the loaded bytes themselves
    n = np.from_dlpack(exported)
    assert n.__array_interface__["data"][0] == exported.data_ptr
    ck.close()
    del ck, exported
    gc.collect()
    t2[0] = 5  # torch's view writes into the shared storage
    assert t1[0].item() == 5 and n[0] == 5 and np.array_equal(t1.numpy()[1:], arrays["a"][1:])


def test_garbage_collection_frees_the_storage(big):
    torch = pytest.importorskip("torch")
    path, _ = big
    baseline = eredu.storage_stats()["live_bytes"]
    for framework in ("np", "pt"):
        loaded = eredu.load_file(path, framework)
        assert eredu.storage_stats()["live_bytes"] >= baseline + 8 * (1 << 20)
        view = loaded["a"][10:20]  # a view keeps the whole storage, as any numpy/torch view does
        del loaded
        gc.collect()
        assert eredu.storage_stats()["live_bytes"] >= baseline + 4 * (1 << 20)
        del view
        gc.collect()
        assert eredu.storage_stats()["live_bytes"] == baseline, framework
    assert torch  # imported for the pt round


def test_dropped_tensors_give_memory_back_to_the_system(tmp_path, writer):
    path = writer(tmp_path / "huge.safetensors", {"w": np.ones(64 << 18, dtype=np.float32)})  # 64 MiB
    gc.collect()
    before = rss_bytes()
    loaded = eredu.load_file(path)
    assert rss_bytes() > before + (48 << 20)
    del loaded
    gc.collect()
    assert rss_bytes() < before + (16 << 20)  # freed storage is unmapped (retention 0 by default)


def test_retention_recycles_storage_across_loads(big):
    path, _ = big
    eredu.set_storage_retention("64M")
    try:
        first = eredu.load_file(path)
        del first
        stats = eredu.storage_stats()
        assert stats["retained_bytes"] >= 8 * (1 << 20)
        again = eredu.load_file(path)
        after = eredu.storage_stats()
        assert after["recycled_allocations"] >= 2 and np.array_equal(again["a"][:3], [0, 1, 2])
        del again
        eredu.trim_storage()
        assert eredu.storage_stats()["retained_bytes"] == 0
    finally:
        eredu.set_storage_retention(0)


def test_a_tensor_outlives_its_pipeline_unit_and_the_pipeline(llama_like):
    path, arrays = llama_like
    kept = []
    with eredu.prefetch(path, lookahead=1) as p:
        for unit in p:
            kept.append(unit["model.layers.0.mlp.up_proj.weight"] if unit.index == 0 else None)
            unit.release()
    del p, unit
    gc.collect()
    assert np.array_equal(kept[0], arrays["model.layers.0.mlp.up_proj.weight"])


def test_a_version_outlives_a_swap(tmp_path, writer):
    a = writer(tmp_path / "a.safetensors", {"w": np.zeros(1024, np.float32)})
    b = writer(tmp_path / "b.safetensors", {"w": np.ones(1024, np.float32)})
    slot = eredu.ModelSlot(a)
    old = slot.current()
    w = old["w"]
    slot.swap_sync(b)
    slot.swap_sync(a)
    slot.swap_sync(b)
    assert slot.current().generation == 4 and slot.current()["w"][0] == 1
    assert old.generation == 1 and not old["w"].any() and not w.any()
    del slot
    gc.collect()
    assert not w.any() and w.shape == (1024,)
