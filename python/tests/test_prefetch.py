# prefetch: units in order with the checkpoint's bytes, within the budget, as an iterator and an
# async iterator; grouping by layers or experts, by a callable, a dict or a list; failures placed at the
# unit that fails; storage bounded when the consumer drops units.
import asyncio
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import eredu
from conftest import write_safetensors


def layer_bytes(arrays, i):
    return sum(a.nbytes for k, a in arrays.items() if k.startswith(f"model.layers.{i}."))


def test_layers_stream_in_order_with_their_bytes(llama_like):
    path, arrays = llama_like
    with eredu.prefetch(path, lookahead=2) as p:
        assert p.units == [f"model.layers.{i}" for i in range(4)] and len(p) == 4
        assert p.skipped == ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
        seen = []
        for unit in p:
            seen.append(unit.name)
            assert unit.index == len(seen) - 1 and unit.pass_ == 0
            assert set(unit) == {k for k in arrays if k.startswith(unit.name + ".")}
            for k, v in unit.items():
                assert np.array_equal(v, arrays[k])
        stats = p.stats()
    assert seen == p.units and stats["delivered"] == 4
    assert stats["resident_high_water"] <= stats["budget"] == 3 * layer_bytes(arrays, 0)


def test_the_budget_bounds_what_is_resident(llama_like):
    path, arrays = llama_like
    one = layer_bytes(arrays, 0)
    with eredu.prefetch(path, lookahead=3, budget=2 * one, passes=3) as p:
        highest = 0
        for unit in p:
            highest = max(highest, p.stats()["storage_live_bytes"])
            del unit  # released: its storage goes back for the next unit
        stats = p.stats()
    assert stats["delivered"] == 12 and stats["resident_high_water"] <= 2 * one
    # Storage live at once: the budget, plus under a page of rounding per tensor.
    assert highest <= 2 * one + 2 * 3 * 4096
    assert stats["storage_recycled_allocations"] > 0  # later passes reuse the released units' storage


def test_async_iteration(llama_like):
    path, arrays = llama_like

    async def main():
        names = []
        async with eredu.prefetch(path, framework="pt", lookahead=1) as p:
            async for unit in p:
                names.append(unit.name)
                q = unit["model.layers.%d.self_attn.q_proj.weight" % unit.index]
                assert np.array_equal(q.numpy(), arrays["model.layers.%d.self_attn.q_proj.weight" % unit.index])
        return names
    pytest.importorskip("torch")
    assert asyncio.run(main()) == [f"model.layers.{i}" for i in range(4)]


def test_other_groupings(llama_like):
    path, arrays = llama_like
    units = {"embed": ["model.embed_tokens.weight"], "head": ["model.norm.weight", "lm_head.weight"]}
    got = [(u.name, sorted(u)) for u in eredu.prefetch(path, units=units)]
    assert got == [("embed", ["model.embed_tokens.weight"]), ("head", ["lm_head.weight", "model.norm.weight"])]
    got = [u.name for u in eredu.prefetch(path, units=[["lm_head.weight"], ["model.norm.weight"]])]
    assert got == ["0", "1"]
    by_kind = eredu.prefetch(path, units=lambda n: n.split(".")[-2] if "layers" in n else None)
    names = [(u.name, len(u)) for u in by_kind]
    assert names == [("q_proj", 4), ("up_proj", 4), ("input_layernorm", 4)]


def test_bad_units_are_typed(llama_like):
    path, arrays = llama_like
    with pytest.raises(eredu.TensorNotFoundError):
        eredu.prefetch(path, units=[["nope"]])
    with pytest.raises(eredu.InvalidArgumentError, match="belongs to a unit"):
        eredu.prefetch(path, units=lambda n: None)
    with pytest.raises(eredu.InvalidArgumentError, match="budget"):
        eredu.prefetch(path, budget=1024)  # smaller than a unit: refused before any read
    with pytest.raises(eredu.InvalidArgumentError):
        eredu.prefetch(path, lookahead=0)


def test_a_failing_unit_is_reported_where_it_is(llama_like):
    path, arrays = llama_like
    p = eredu.prefetch(path, lookahead=1)
    # Cut the file inside layer 2 after open: layers 0 and 1 arrive, then layer 2 fails.
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    cut = 8 + n + header["model.layers.2.mlp.up_proj.weight"]["data_offsets"][0] + 8
    os.truncate(path, cut)
    delivered = []
    with pytest.raises(eredu.IoError) as e:
        for unit in p:
            delivered.append(unit.name)
    # Units loaded before the cut may arrive (lookahead); then the first read of the changed
    # file fails, naming its tensor (errc::file_changed, or the short read past the cut).
    assert delivered == ["model.layers.0", "model.layers.1"][:len(delivered)]
    assert e.value.kind in ("unexpected_eof", "file_changed") and e.value.file == str(path)
    assert e.value.tensor in arrays and e.value.tensor in str(e.value)
    with pytest.raises(eredu.IoError):
        next(p)  # the error stays
    p.close()


def test_unit_release_and_context(llama_like):
    path, arrays = llama_like
    p = eredu.prefetch(path, lookahead=1)
    first = next(p)
    with first:
        w = first["model.layers.0.input_layernorm.weight"]
    assert first.released and np.array_equal(w, arrays["model.layers.0.input_layernorm.weight"])
    second = next(p)
    second.release()
    second.release()
    p.close()
    with pytest.raises(StopIteration):
        next(p)  # closed: the stream has ended


def test_gguf_blk_layers_stream_as_eredu_pipeline_streams_them(tmp_path, eredu_cli):
    # One grouper (eredu::app::group_layers) for both: llama.cpp's blk.N are layers here too.
    import subprocess
    path = tmp_path / "model.gguf"
    subprocess.run([eredu_cli, "gen", "--format", "gguf", "--dtype", "f32", "--size", "256K", "--layers", "3",
                    "--quiet", str(path)], check=True)
    cli = json.loads(subprocess.run([eredu_cli, "pipeline", "--json", "--quiet", str(path)], check=True,
                                    capture_output=True, text=True).stdout)
    with eredu.prefetch(path) as p:
        assert p.units == ["blk.0", "blk.1", "blk.2"] and cli["unit_count"] == 3
        assert len(p.skipped) == cli["skipped_tensor_count"] > 0
        assert all(not name.startswith("blk.") for name in p.skipped)
        tensors, unit_bytes = 0, []
        for unit in p:
            assert len(unit) > 0 and all(k.startswith(unit.name + ".") for k in unit)
            tensors += len(unit)
            unit_bytes.append(sum(v.nbytes for v in unit.values()))
    assert tensors == cli["layer_tensor_count"]
    assert unit_bytes == [u["bytes"] for u in cli["units"]]


def test_experts_stream_one_expert_at_a_time_as_eredu_pipeline_streams_them(tmp_path, eredu_cli):
    # Mixtral's names: each layer's dense tensors (attention, router), then each expert, a unit each;
    # the preset's name parsed and the grouping done by eredu::app for both front ends.
    import subprocess
    rng = np.random.default_rng(3)
    arrays = {"model.embed_tokens.weight": rng.standard_normal((8, 4), dtype=np.float32)}
    for layer in range(2):
        arrays[f"model.layers.{layer}.self_attn.q_proj.weight"] = rng.standard_normal((4, 4), dtype=np.float32)
        arrays[f"model.layers.{layer}.block_sparse_moe.gate.weight"] = rng.standard_normal((3, 4), dtype=np.float32)
        for e in range(3):
            for w in ("w1", "w2", "w3"):
                arrays[f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight"] = rng.standard_normal(
                    (8, 4), dtype=np.float32)
    path = write_safetensors(tmp_path / "moe.safetensors", arrays)
    want = [u for layer in range(2) for u in [f"model.layers.{layer}"] + [
        f"model.layers.{layer}.block_sparse_moe.experts.{e}" for e in range(3)]]
    cli = json.loads(subprocess.run([eredu_cli, "pipeline", "--units", "experts", "--json", "--quiet", str(path)],
                                    check=True, capture_output=True, text=True).stdout)
    with eredu.prefetch(path, units="experts", lookahead=1) as p:
        assert p.units == want and cli["unit_count"] == len(want)
        assert p.skipped == ["model.embed_tokens.weight"] and cli["skipped_tensor_count"] == 1
        unit_bytes = []
        for unit in p:
            prefix = unit.name + "."
            expected = {k for k in arrays if k.startswith(prefix) and (".experts." in unit.name or ".experts." not in k)}
            assert set(unit) == expected
            for k in unit:
                assert np.array_equal(unit[k], arrays[k])
            unit_bytes.append(sum(v.nbytes for v in unit.values()))
    assert unit_bytes == [u["bytes"] for u in cli["units"]]
    # The layers preset keeps each layer whole; a name that is no preset is a typed error listing them.
    assert eredu.prefetch(path, units="layers").units == ["model.layers.0", "model.layers.1"]
    with pytest.raises(eredu.InvalidArgumentError, match="units must be layers or experts, not 'expert'"):
        eredu.prefetch(path, units="expert")


def test_a_real_gguf_streams_its_blk_layers():
    from conftest import REPO
    data = Path(os.environ.get("EREDU_SHARED_DATA_DIR", REPO.parent / "shared" / "data"))
    path = data / "gguf-quant" / "tiny-llama-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip(f"no {path}: skipping")
    with eredu.prefetch(path, unsupported="raw") as p:
        assert p.units and all(u == f"blk.{i}" for i, u in enumerate(p.units))
        assert "token_embd.weight" in p.skipped
        names = [k for unit in p for k in unit]
    assert len(names) == len(set(names)) and all(k.startswith("blk.") for k in names)
