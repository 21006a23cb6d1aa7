# weights="map" / "map-lock": tensors kept in their stored dtype are the checkpoint's page-cache
# pages, mapped read-only (cpu::WeightStorage). Each trade-off docs/python.md states is shown
# here: the arrays are the file's mapping (no copy), writes raise instead of killing the process,
# torch's (and numpy's with "map-private") are private copy-on-write mappings whose writes never
# reach the file, the copying classes refuse the option, a rename over the file leaves the weights
# intact while a rewrite in place changes them, and map-lock pins the pages.
import asyncio
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

import eredu


@pytest.fixture
def checkpoint(tmp_path, writer):
    arrays = {
        "embed": (np.arange(64 * 1024) % 4096).astype(np.float32).reshape(256, 256),  # 256 KiB: many pages
        "norm": np.linspace(-1, 1, 256, dtype=np.float32),
        "ids": np.arange(100, dtype=np.int64),
    }
    return writer(tmp_path / "model.safetensors", arrays), arrays


def mapping_of(address):
    """The path of the file mapped at `address` in this process ('' for anonymous memory)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"address {address:#x} is not mapped")


def locked_bytes():
    """VmLck of this process."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmLck:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmLck in /proc/self/status")


def test_mapped_arrays_are_the_files_pages_read_only_and_equal_to_its_bytes(checkpoint):
    path, arrays = checkpoint
    loaded = eredu.load_file(path, framework="np", weights="map")
    assert list(loaded) == list(arrays)
    for name, want in arrays.items():
        got = loaded[name]
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert mapping_of(got.ctypes.data) == str(path), name
        assert not got.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):
            got[0] = 1  # raises; does not fault on the read-only mapping
    np.testing.assert_array_equal(loaded["embed"], arrays["embed"])  # untouched by the attempts


def test_copied_arrays_stay_the_default(checkpoint):
    path, arrays = checkpoint
    for loaded in (eredu.load_file(path), eredu.load_file(path, weights="copy")):
        got = loaded["embed"]
        assert mapping_of(got.ctypes.data) != str(path)
        np.testing.assert_array_equal(got, arrays["embed"])


def test_a_mapped_array_cannot_be_made_writable(checkpoint):
    path, _ = checkpoint
    got = eredu.load_file(path, weights="map")["embed"]
    with pytest.raises(ValueError):
        got.flags.writeable = True  # numpy refuses: the array does not own its bytes
    mine = got.copy()  # what docs/python.md says to do for a writable array
    mine[0, 0] = -1.0
    assert mine[0, 0] == -1.0 and got[0, 0] == 0.0


def test_casts_are_copied_even_when_mapping_is_asked(checkpoint):
    path, arrays = checkpoint
    loaded = eredu.load_file(path, framework="np", dtype="float16", weights="map")
    got = loaded["embed"]
    assert got.dtype == np.float16
    assert mapping_of(got.ctypes.data) != str(path)
    np.testing.assert_array_equal(got, arrays["embed"].astype(np.float16))
    assert not loaded["ids"].flags.writeable  # integers keep their dtype: still mapped


def test_safe_open_and_aload_map_too_and_arrays_outlive_the_checkpoint(checkpoint):
    path, arrays = checkpoint
    with eredu.safe_open(path, framework="np", weights="map") as f:
        norm = f.get_tensor("norm")
        rows = f.get_slice("embed")[16:32]  # a contiguous run of rows: mapped as well
    assert mapping_of(norm.ctypes.data) == str(path) and not norm.flags.writeable
    np.testing.assert_array_equal(norm, arrays["norm"])
    np.testing.assert_array_equal(rows, arrays["embed"][16:32])
    loaded = asyncio.run(eredu.aload(path, weights="map"))
    assert mapping_of(loaded["embed"].ctypes.data) == str(path)
    np.testing.assert_array_equal(loaded["embed"], arrays["embed"])


def test_a_rename_over_the_file_keeps_the_weights_a_rewrite_in_place_changes_them(checkpoint, writer, tmp_path):
    path, arrays = checkpoint
    loaded = eredu.load_file(path, weights="map")
    newer = {k: v + 1 for k, v in arrays.items()}
    os.replace(writer(tmp_path / "next.safetensors", newer), path)
    np.testing.assert_array_equal(loaded["embed"], arrays["embed"])  # the old inode's bytes
    np.testing.assert_array_equal(eredu.load_file(path, weights="map")["embed"], newer["embed"])

    again = eredu.load_file(path, weights="map")
    with open(path, "r+b") as f:  # what docs/python.md warns against: writing into a served file
        f.seek(os.path.getsize(path) - arrays["ids"].nbytes)
        f.write(np.full(100, 7, dtype=np.int64).tobytes())
    np.testing.assert_array_equal(again["ids"], np.full(100, 7, dtype=np.int64))


def test_map_lock_pins_the_pages_while_the_arrays_live(checkpoint):
    path, arrays = checkpoint
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != resource.RLIM_INFINITY and soft < (4 << 20) and os.geteuid() != 0:
        pytest.skip(f"RLIMIT_MEMLOCK is {soft} bytes and this process cannot raise it: nothing to pin within")
    before = locked_bytes()
    loaded = eredu.load_file(path, weights="map-lock")
    assert locked_bytes() - before >= arrays["embed"].nbytes
    assert mapping_of(loaded["embed"].ctypes.data) == str(path)
    np.testing.assert_array_equal(loaded["embed"], arrays["embed"])
    del loaded
    assert locked_bytes() - before < arrays["embed"].nbytes  # unmapping unlocks


def test_refusals_are_typed_and_name_the_reason(checkpoint):
    path, _ = checkpoint
    with pytest.raises(eredu.Error, match="private copy-on-write mappings, which eredu does not lock") as e:
        eredu.load_file(path, framework="pt", weights="map-lock")
    assert e.value.kind == "invalid_argument"
    with pytest.raises(eredu.Error, match="weights must be 'copy', 'map', 'map-lock' or 'map-private', not 'mapped'"):
        eredu.load_file(path, weights="mapped")
    with pytest.raises(eredu.Error, match="ModelSlot copies its tensors"):
        eredu.ModelSlot(weights="map")
    with pytest.raises(eredu.Error, match="prefetch copies its tensors"):
        eredu.prefetch(path, units="tensors", weights="map-lock")
    eredu.load_file(path, framework="pt", weights="copy")  # copying stays available to torch


def test_map_lock_beyond_the_memlock_limit_is_a_typed_error_naming_it(checkpoint):
    path, _ = checkpoint
    # Root's CAP_IPC_LOCK exempts it from RLIMIT_MEMLOCK: the child drops it before it starts.
    drop = ""
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv (util-linux): cannot drop CAP_IPC_LOCK to meet the limit")
        drop = "setpriv --bounding-set -ipc_lock "
    script = ("import eredu, sys\n"
              "try:\n"
              "    eredu.load_file(sys.argv[1], weights='map-lock')\n"
              "except eredu.OutOfMemoryError as e:\n"
              "    print('refused:', e.kind, e)\n")
    out = subprocess.run(["sh", "-c", f'ulimit -l 64 && exec {drop}"$0" -c "$1" "$2"', sys.executable, script,
                          str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: out_of_memory"), out.stdout + out.stderr
    assert "RLIMIT_MEMLOCK is 64 KiB" in out.stdout and "embed" in out.stdout


def mapping_line(address):
    """The /proc/self/maps line of the mapping holding `address`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return line
    raise AssertionError(f"address {address:#x} is not mapped")


@pytest.mark.parametrize("how", ["load_file", "safe_open"])
def test_torch_mapped_weights_are_writable_private_copies_of_the_files_pages(checkpoint, how):
    torch = pytest.importorskip("torch")
    path, arrays = checkpoint
    original = path.read_bytes()
    if how == "load_file":
        loaded = eredu.load_file(path, framework="pt", weights="map")
    else:
        with eredu.safe_open(path, framework="pt", weights="map") as f:
            loaded = {n: f.get_tensor(n) for n in f.keys()}
    for name, want in arrays.items():
        t = loaded[name]
        assert torch.equal(t, torch.from_numpy(want)), name  # reads are the file's bytes
        line = mapping_line(t.data_ptr())
        assert line.rstrip().endswith(str(path)) and " rw-p " in line, (name, line)  # zero-copy, private
    embed = loaded["embed"]
    embed[0].fill_(-7.0)  # a write through the tensor: no SIGSEGV, a private copy of the page
    embed.mul_(2)
    assert float(embed[0, 0]) == -14.0 and float(embed[255, 255]) == 2 * float(arrays["embed"][255, 255])
    assert path.read_bytes() == original  # the file never sees it
    again = eredu.load_file(path, framework="np", weights="map")
    np.testing.assert_array_equal(again["embed"], arrays["embed"])  # nor do other mappings of it


def test_numpy_map_private_maps_privately(checkpoint):
    # numpy 1.x marks every DLPack import read-only (copied arrays too), so numpy cannot write
    # these; what "map-private" changes for numpy is only the kind of mapping.
    path, arrays = checkpoint
    loaded = eredu.load_file(path, framework="np", weights="map-private")
    for name, want in arrays.items():
        np.testing.assert_array_equal(loaded[name], want)
        line = mapping_line(loaded[name].ctypes.data)
        assert line.rstrip().endswith(str(path)) and " rw-p " in line, (name, line)
