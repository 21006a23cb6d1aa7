"""ModelSlot: hot-swap a serving model while requests keep reading it.

    slot = eredu.ModelSlot("model-v1/", framework="pt")
    weights = slot.current()                 # wait-free; keep it for the whole request
    y = weights["lm_head.weight"] @ x
    await slot.swap("model-v2/", verify=True, canary=check)   # or slot.swap_sync(...)

A swap opens the new checkpoint, loads it on a background arena (`threads`, default 1: serving
keeps the other cores) within a bounded staging budget, verifies its SHA-256 digests
(`verify=None`: when the checkpoint records any, in "sha256:<tensor>" metadata or a
`<file>.sha256.json` sidecar; True: they must exist; False: never), runs `canary(candidate)` — a
mapping of the new tensors; raise, or return False, to reject; it may be a coroutine function —
and publishes with one atomic store. Any failure raises (CanaryError, ChecksumError, IoError, ...)
and leaves the old version serving. The new checkpoint must hold the same tensors, dtypes and
shapes as the first one.

`current()` returns a Version: a read-only mapping with `.generation` and `.origin`. It keeps its
version's tensors alive while referenced; a swap never changes a Version already handed out.
"""

import os

from . import _bridge, _native
from ._errors import CanaryError
from ._options import check_weights, os_path, parse_count, verify_mode
from ._safe_open import _Reader


class Version:
    """One published (or candidate) version: a read-only mapping of tensor name -> tensor."""

    def __init__(self, tensors, generation, origin, native=None):
        self._tensors = tensors
        self._native = native  # keeps the C++ version alive along with its storage
        self.generation = generation
        self.origin = origin

    def __getitem__(self, name):
        return self._tensors[name]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self):
        return len(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def keys(self):
        return self._tensors.keys()

    def items(self):
        return self._tensors.items()

    def values(self):
        return self._tensors.values()

    def get(self, name, default=None):
        return self._tensors.get(name, default)

    def __repr__(self):
        return f"<eredu.Version generation {self.generation} from {self.origin!r}: {len(self)} tensors>"




class _Slot:
    """What ModelSlot and InPlaceModelSlot share: the tensor rules, the swap and its report."""

    def __init__(self, native, framework, dtype, bf16, unsupported, options, where):
        self._rules = _Reader.options(framework, dtype, bf16, unsupported)
        check_weights(options, self._rules[0], where=where)
        if self._rules[0] == "pt":
            # Imported now, not by the first swap's canary: a swap's canary_s must time the
            # canary, not torch's import (seconds, on a cold start).
            from ._frameworks import torch_module
            torch_module()
        self._options = options
        self._native = native
        self._plans = None

    @property
    def generation(self):
        """The serving generation (0 before the first swap)."""
        return self._native.generation

    @property
    def swapping(self):
        return self._native.swapping

    def _convert(self, keys, tensors):
        from ._frameworks import to_framework
        reader_fw = self._rules[0]
        return {k: to_framework(t, reader_fw, self._plans[k].post) for k, t in zip(keys, tensors)}

    def _version(self, keys, tensors, generation, origin, native=None):
        return Version(self._convert(keys, tensors), generation, origin, native)

    def _start(self, path, verify, canary, origin, blocking, options, **native_options):
        fw, cast, bf16, unsupported = self._rules
        mode = verify_mode(verify)
        published = isinstance(path, getattr(_native, "PublishedVersion", ()))
        if published:
            # A version a Publisher offers (Subscriber.open): always verified, against the
            # publisher's digests of what this slot reads.
            if not origin:
                origin = path.path
            reader = _Reader(path, fw, cast, bf16, unsupported, mode)
        else:
            path = os_path(path)
            if not origin:
                origin = os.fsdecode(path)
            reader = _Reader.open(path, fw, cast, bf16, unsupported, copy_resident=False, copier=type(self).__name__,
                                  **{**self._options, **options})
        try:
            specs = None
            if self._plans is None or self._native.generation == 0:
                specs, plans = [], {}
                for name in reader.order:
                    spec, plan = reader.spec(name)
                    specs.append(spec)
                    plans[name] = plan
                self._plans = plans
            record = _Rejection()
            record.origin = origin
            job = None
            if canary is not None:
                keys = list(self._plans)

                def job(tensors, finish, is_blocking):
                    candidate = self._version(keys, tensors, self.generation + 1, origin)
                    _bridge.run_canary(canary, candidate, finish, is_blocking, record)

            op = self._native.swap(reader.native, specs, mode, job, blocking, origin, **native_options)
        finally:
            if not published:
                reader.native.close()  # the swap keeps it open while it runs
        return op, record

    def _finished(self, report, record):
        return report

    def _run_sync(self, path, verify, canary, origin, progress, options, **native_options):
        _bridge.check_progress(progress)
        op, record = self._start(path, verify, canary, origin, True, options, **native_options)
        try:
            report = self._finished(_bridge.wait(op, progress), record)
        except CanaryError as e:
            raise e from record.exception
        _bridge.done(op, progress)
        return report

    async def _run(self, path, verify, canary, origin, progress, options, **native_options):
        _bridge.check_progress(progress)
        op, record = self._start(path, verify, canary, origin, False, options, **native_options)
        try:
            report = self._finished(await _bridge.wait_async(op, progress), record)
        except CanaryError as e:
            raise e from record.exception
        _bridge.done(op, progress)
        return report

    def storage(self):
        """The slot's storage pool: live_bytes, retained_bytes (kept for the next swap), ..."""
        return self._native.storage()


class ModelSlot(_Slot):
    """The serving version of a model, hot-swapped (see the module comment).

    ModelSlot(path=None, *, framework="np", dtype=None, bf16=None, unsupported="error", threads=1,
              verify=None, canary=None, budget=None, ...)

    Paths (here and in swap) are a str, bytes or os.PathLike. With a path, the first version is loaded (blocking) before the constructor returns; without
    one, current() is None until the first swap.
    """

    def __init__(self, path=None, *, framework="np", dtype=None, bf16=None, unsupported="error", threads=1,
                 verify=None, canary=None, **options):
        super().__init__(_native.ModelSlot(parse_count("threads", threads)), framework, dtype, bf16, unsupported,
                         options, "ModelSlot")
        self._cached = None
        if path is not None:
            self.swap_sync(path, verify=verify, canary=canary)

    def current(self):
        """The serving Version (wait-free), or None before the first swap."""
        native = self._native.current()
        if native is None:
            return None
        cached = self._cached
        if cached is not None and cached.generation == native.generation:
            return cached
        version = self._version(native.keys(), native.tensors(), native.generation, native.origin, native)
        self._cached = version
        return version

    def _finished(self, report, record):
        self._cached = None  # the retired version goes when its last reader lets go
        return report

    def swap_sync(self, path, *, verify=None, canary=None, origin=None, progress=None, **options):
        """swap(), blocking (Ctrl-C cancels it); returns the swap report."""
        return self._run_sync(path, verify, canary, origin, progress, options)

    async def swap(self, path, *, verify=None, canary=None, origin=None, progress=None, **options):
        """Loads, verifies, canaries and publishes `path`; returns the report (generation, bytes,
        verified_bytes, load_s, verify_s, canary_s, publish_pause_ns). Raises, leaving the old
        version serving, on any failure; cancelling the task cancels the swap (before publication).
        `progress(done, total, phase)` is called on the loop's thread as the new version's bytes
        land ("read"), and once the swap has published ("done"); what it raises cancels the swap.
        `options` (budget, reader, ...) override the slot's for this swap."""
        return await self._run(path, verify, canary, origin, progress, options)

    def __repr__(self):
        return f"<eredu.ModelSlot generation {self.generation}>"


class _Rejection:
    """Keeps the exception a canary raised, to chain it to the CanaryError, and the swap's origin."""

    def __init__(self):
        self.exception = None
        self.origin = None

    def __call__(self, e):
        self.exception = e
