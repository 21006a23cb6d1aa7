"""Whole-checkpoint loads: load_file (blocking) and aload / aread (asyncio).

    state_dict = eredu.load_file("model/", framework="pt")               # every tensor
    state_dict = await eredu.aload("model.safetensors", framework="np")  # the same, awaited
    w = await eredu.aread("model.safetensors", "lm_head.weight", index=(slice(0, 1024),))

A load is one unit through eredu's engine and CPU backend: every tensor's read starts at once
(io_uring), fresh memory is populated on every core while other tensors are read, page-cache
resident tensors are copied (or converted, with dtype=) on a TBB arena, staging stays within the
budget, and a failure anywhere fails the whole load with nothing returned.
"""

from . import _bridge
from ._options import device as check_device, framework as check_framework
from ._safe_open import _Reader


def _check(device, framework):
    return check_device(device, check_framework(framework))


def load_file(filename, framework="np", dtype=None, threads=None, budget=None, *, device="cpu", bf16=None,
              unsupported="error", verify=False, progress=None, **options):
    """Every tensor of the checkpoint at `filename` (file, directory or index; a str, bytes or
    os.PathLike), as a dict in file order. `dtype` converts float tensors on load; `threads` and `budget` (staging bytes) tune the
    load; `verify` checks the bytes against the checkpoint's recorded digests (False: never; None:
    those it records; True: every tensor must have one); `progress(done, total, phase)` is called
    from this thread as the bytes land (eredu._bridge says when); see safe_open for `bf16`,
    `unsupported` and the other options."""
    target = _check(device, framework)
    _bridge.check_progress(progress)
    reader = _Reader.open(filename, framework, dtype, bf16, unsupported, threads=threads, budget=budget,
                          verify=verify, **options)
    reader.device = target
    try:
        return reader.read(list(reader.order), progress)
    finally:
        reader.native.close()


async def aload(filename, framework="np", dtype=None, threads=None, budget=None, *, device="cpu", bf16=None,
                unsupported="error", names=None, verify=False, progress=None, **options):
    """load_file, awaitable: the asyncio loop keeps running while eredu loads. `names` loads only
    those tensors; `progress` is called on the asyncio loop's thread. Cancelling the task cancels
    the load, returns every lease and raises asyncio.CancelledError."""
    target = _check(device, framework)
    _bridge.check_progress(progress)
    reader = await _Reader.aopen(filename, framework, dtype, bf16, unsupported, threads=threads,
                                 budget=budget, verify=verify, **options)
    reader.device = target
    try:
        return await reader.aread(list(reader.order if names is None else names), progress)
    finally:
        reader.native.close()


async def aread(filename, name, index=None, framework="np", *, dtype=None, device="cpu", bf16=None,
                unsupported="error", verify=False, progress=None, **options):
    """One tensor of `filename`, awaitable; with `index` (what `slice[index]` takes) only the
    selected part is read. `progress` as aload's."""
    target = _check(device, framework)
    _bridge.check_progress(progress)
    reader = await _Reader.aopen(filename, framework, dtype, bf16, unsupported, copy_resident=False,
                                 verify=verify, **options)
    reader.device = target
    try:
        if index is None:
            return (await reader.aread([name], progress))[name]
        op, plan = reader.start_slice(name, index)
        out = reader.convert(await _bridge.wait_async(op, progress), [plan])[0]
        _bridge.done(op, progress)
        return out
    finally:
        reader.native.close()
