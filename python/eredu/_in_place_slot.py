"""InPlaceModelSlot: one copy of the model in memory, every version written into its storage.

    slot = eredu.InPlaceModelSlot("model-v1/", framework="np")
    with slot.read() as weights:             # `async with` on an event loop
        y = weights["lm_head.weight"] @ x    # the serving storage itself, not a copy
    await slot.patch("model-v2/", verify=True)   # writes only the 64-byte blocks that differ
    await slot.swap("model-v3/")                 # stages a whole copy, then writes it in

For a server without memory for a second copy of its model (engine::InPlaceModelSlot). A swap
loads, verifies and canaries as ModelSlot's does, then waits until no read is held, writes, and
lets reads go on; a patch holds only the blocks that differ (at most `patch_budget` bytes), and
its canary sees the patched model, whose old bytes come back if it refuses. Any failure raises
and leaves every serving byte as it was.

A read is held from `with slot.read()` to the end of the block: that is how long its tensors
keep one version. They are views of the serving storage, so after the block they may change.
Reads wait only while a swap writes. Reads of one thread (or task) nest, and what would wait
forever raises instead: a blocking read or swap on a thread where another task holds a read, or
a swap from the task that holds one.
"""

import asyncio
import threading

from . import _bridge, _native
from ._model_slot import Version, _Slot
from ._options import invalid, parse_count

_PATCH_BUDGET = 256 << 20


def _holder():
    """Who holds a read: this thread, and the asyncio task running on it, if any."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), task


class _Read:
    """`with slot.read() as weights` / `async with slot.read() as weights` (see the module
    comment); `weights` is a Version, or None before the first swap."""

    def __init__(self, slot):
        self._slot = slot
        self._key = None

    def __enter__(self):
        self._key = _holder()
        return self._slot._enter(self._key)

    async def __aenter__(self):
        self._key = _holder()
        return await self._slot._enter_async(self._key)

    def __exit__(self, *exc):
        self._slot._leave(self._key)

    async def __aexit__(self, *exc):
        self._slot._leave(self._key)


class InPlaceModelSlot(_Slot):
    """A model swapped in place (see the module comment).

    InPlaceModelSlot(path=None, *, framework="np", dtype=None, bf16=None, unsupported="error",
                     threads=1, verify=None, canary=None, budget=None, ...)

    As ModelSlot's: with a path, the first version is loaded (blocking) before the constructor
    returns; without one, reads give None until the first swap.
    """

    def __init__(self, path=None, *, framework="np", dtype=None, bf16=None, unsupported="error", threads=1,
                 verify=None, canary=None, **options):
        super().__init__(_native.InPlaceModelSlot(parse_count("threads", threads)), framework, dtype, bf16,
                         unsupported, options, "InPlaceModelSlot")
        self._lock = threading.Lock()
        self._held = {}  # holder -> [native read, Version, depth]
        self._views = None  # (instance, tensors): the storage's views, the same for every version
        self._origins = {}  # generation -> origin
        if path is not None:
            self.swap_sync(path, verify=verify, canary=canary)

    def read(self):
        """A read of the serving version, as a context manager (see the module comment)."""
        return _Read(self)

    def _nested(self, key):
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held[2] += 1
                return True, held[1]
            if any(k[0] == key[0] for k in self._held):
                return False, "another task on this thread"
            return False, None

    def _enter(self, key):
        nested, value = self._nested(key)
        if nested:
            return value
        native = self._native.try_read()
        if native is None and self._native.generation > 0:
            if value is not None:
                raise invalid(
                    f"{value} holds a read of this InPlaceModelSlot and a swap is writing: a blocking read "
                    "would wait for it forever; use `async with slot.read()`")
            native = _bridge.wait(self._native.read())
        return self._hold(key, native)

    async def _enter_async(self, key):
        nested, value = self._nested(key)
        if nested:
            return value
        native = self._native.try_read()
        if native is None and self._native.generation > 0:
            native = await _bridge.wait_async(self._native.read())
        return self._hold(key, native)

    def _hold(self, key, native):
        if native is None:
            return None
        version = Version(self._tensors(native), native.generation, self._origins.get(native.generation), native)
        with self._lock:
            self._held[key] = [native, version, 1]
        return version

    def _leave(self, key):
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return
            held[2] -= 1
            if held[2] > 0:
                return
            del self._held[key]
        held[0].release()

    def _tensors(self, native):
        views = self._views
        if views is None or views[0] != native.instance:
            views = (native.instance, self._convert(native.keys(), native.tensors()))
            self._views = views
        return views[1]

    def _check_not_holding(self, blocking):
        me = _holder()
        with self._lock:
            holders = [k for k in self._held if (k[0] == me[0] if blocking else k == me)]
        if holders:
            who = "this task" if holders[0][1] is not None and not blocking else "this thread"
            raise invalid(f"{who} holds a read of this InPlaceModelSlot, which the swap would wait for "
                                       "forever: leave the `with slot.read()` block first")

    def _finished(self, report, record):
        self._origins[report["generation"]] = record.origin
        while len(self._origins) > 16:
            del self._origins[min(self._origins)]
        return report

    def swap_sync(self, path, *, verify=None, canary=None, origin=None, progress=None, **options):
        """swap(), blocking (Ctrl-C cancels it before the write); returns the swap report."""
        self._check_not_holding(True)
        return self._run_sync(path, verify, canary, origin, progress, options)

    async def swap(self, path, *, verify=None, canary=None, origin=None, progress=None, **options):
        """Loads `path` into a staged copy, verifies and canaries it, then writes it into the
        serving storage while no read is held; returns the report (as ModelSlot.swap's, with
        publish_pause_ns: how long reads waited, readers_drained_ns: the part spent waiting for
        reads held). Raises, leaving every serving byte as it was, on any failure."""
        self._check_not_holding(False)
        return await self._run(path, verify, canary, origin, progress, options)

    def patch_sync(self, path, *, verify=None, canary=None, origin=None, progress=None, patch_budget=_PATCH_BUDGET,
                   **options):
        """patch(), blocking (Ctrl-C cancels it before the write); returns the report."""
        self._check_not_holding(True)
        return self._run_sync(path, verify, canary, origin, progress, options,
                              patch_budget=parse_count("patch_budget", patch_budget))

    async def patch(self, path, *, verify=None, canary=None, origin=None, progress=None, patch_budget=_PATCH_BUDGET,
                    **options):
        """Changes the serving version into `path` by writing only the 64-byte blocks that differ,
        with no staged copy: each tensor is read in bounded chunks, compared with the serving
        bytes and hashed; once every digest is checked, the kept blocks (at most `patch_budget`
        bytes, else BudgetError before any write) are written while no read is held, and the
        canary runs on the patched model (its refusal puts the old bytes back). The report's
        written_bytes is what it wrote, hashed_bytes what it hashed to check the digests. The first
        version comes by swap(), not patch()."""
        self._check_not_holding(False)
        return await self._run(path, verify, canary, origin, progress, options,
                               patch_budget=parse_count("patch_budget", patch_budget))

    def __repr__(self):
        return f"<eredu.InPlaceModelSlot generation {self.generation}>"
