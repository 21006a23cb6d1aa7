# A checkpoint that is not in the page cache: tensors inside a page are read O_DIRECT with their
# page window into storage laid out like the file (docs/design.md), so their arrays start at the
# file's offset within a page instead of on 64 bytes. numpy and torch get the file's values
# either way, and the arrays behave as any other load's.
import json
import os
import struct

import numpy as np
import pytest
import torch

import eredu
from conftest import write_safetensors


def evict(path):
    """Drops the file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def file_offsets(path):
    """Each tensor's absolute file offset, from the header."""
    raw = open(path, "rb").read(8)
    (n,) = struct.unpack("<Q", raw)
    header = json.loads(open(path, "rb").read(8 + n)[8:])
    return {k: 8 + n + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_a_cold_checkpoint_loads_the_files_values_at_the_files_alignment(tmp_path, framework):
    rng = np.random.default_rng(3)
    tensors = {
        "pad": np.arange(12, dtype=np.uint8),  # every later tensor starts inside a page
        "w": rng.standard_normal((300, 257)).astype(np.float32),
        "h": rng.standard_normal((200, 170)).astype(np.float16),
        "b": rng.standard_normal((9,)).astype(np.float32),  # small: a plain block
    }
    path = write_safetensors(tmp_path / "m.safetensors", tensors)
    offsets = file_offsets(path)
    assert offsets["w"] % 4096 != 0 and offsets["w"] % 4 == 0
    evict(path)
    out = eredu.load_file(path, framework=framework)
    for name, want in tensors.items():
        got = out[name].numpy() if framework == "pt" else out[name]
        np.testing.assert_array_equal(got, want)
    pointer = out["w"].data_ptr() if framework == "pt" else out["w"].ctypes.data
    if pointer % 64 == 0:
        pytest.skip("the file stayed in the page cache or its file system refuses O_DIRECT: no window was read")
    assert pointer % 4096 == offsets["w"] % 4096
    # The arrays are ordinary ones (numpy's read-only as every load's, torch's writable), and
    # arithmetic on them is exact.
    if framework == "pt":
        out["w"].mul_(2)
        assert torch.equal(out["w"], torch.from_numpy(tensors["w"] * 2))
    else:
        assert not out["w"].flags.writeable
        np.testing.assert_array_equal(out["w"] * 2 + 1, tensors["w"] * 2 + 1)
