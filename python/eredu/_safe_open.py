"""safe_open: Hugging Face safetensors' `safe_open`, served by eredu.

    with eredu.safe_open("model.safetensors", framework="pt") as f:
        for name in f.keys():
            w = f.get_tensor(name)
        rows = f.get_slice("lm_head.weight")[0:1024, :]   # reads only those rows

Same semantics as safetensors' (keys() sorted, metadata() None when the file has none,
get_slice's indexing and bounds, get_tensors(), backend=, "File is closed" from every method once
closed), plus what eredu adds: sharded directories and `*.index.json` open as one
checkpoint; `load()` reads many tensors as one concurrent unit; `aget_tensor()` / `aload()` are
awaitable; `dtype=` casts on load; errors are typed (eredu.Error).
"""

from . import _bridge, _native
from ._errors import python_error
from ._frameworks import plan_tensor, to_framework
from ._indexing import selection
from ._options import (cast_target, check_weights, choice, device as check_device, framework as check_framework,
                       open_options, os_path, parse_size, verify_mode)
from ._read_ahead import DEFAULT_LIMIT, ReadAhead


class TensorInfo:
    """What the catalog knows of one tensor."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "file", "offset")

    def __init__(self, name, dtype, shape, nbytes, file, offset):
        self.name, self.dtype, self.shape, self.nbytes, self.file, self.offset = name, dtype, shape, nbytes, file, offset

    def __repr__(self):
        return f"TensorInfo({self.name!r}, {self.dtype}, {list(self.shape)}, {self.nbytes} bytes)"


class _Reader:
    """An open checkpoint and the dtype rules its tensors are delivered with (shared by safe_open,
    load_file, prefetch and ModelSlot)."""

    def __init__(self, native, fw, cast, bf16, unsupported, verify=0):
        self.native = native
        self.verify = verify  # the extension's mode (_options.verify_mode)
        self.fw = fw
        self.cast = cast
        self.bf16 = bf16
        self.unsupported = unsupported
        self.files = [f["path"] for f in native.files()]
        self.infos = {}
        self.order = []
        for name, dtype, shape, nbytes, file, offset in native.tensors():
            self.infos[name] = TensorInfo(name, dtype, shape, nbytes, file, offset)
            self.order.append(name)

    @classmethod
    def options(cls, framework, dtype, bf16, unsupported):
        fw = check_framework(framework)
        cast = cast_target(dtype)
        if bf16 is None:
            bf16 = "uint16"
        choice("bf16", bf16, ("uint16", "float32"))
        choice("unsupported", unsupported, ("error", "raw"))
        if fw == "np" and cast == "BF16" and bf16 == "float32":
            raise python_error("invalid_argument", "dtype='bfloat16' and bf16='float32' contradict each other")
        return fw, cast, bf16, unsupported

    @classmethod
    def open(cls, path, framework="np", dtype=None, bf16=None, unsupported="error", copy_resident=True, copier=None,
             verify=False, **options):
        fw, cast, bf16, unsupported = cls.options(framework, dtype, bf16, unsupported)
        check_weights(options, fw, where=copier)
        mode = verify_mode(verify)
        path = os_path(path)
        native = _bridge.wait(_native.open(path, open_options(path, options, copy_resident=copy_resident)))
        return cls(native, fw, cast, bf16, unsupported, mode)

    @classmethod
    async def aopen(cls, path, framework="np", dtype=None, bf16=None, unsupported="error", copy_resident=True,
                    verify=False, **options):
        fw, cast, bf16, unsupported = cls.options(framework, dtype, bf16, unsupported)
        check_weights(options, fw)
        mode = verify_mode(verify)
        path = os_path(path)
        native = await _bridge.wait_async(_native.open(path, open_options(path, options, copy_resident=copy_resident)))
        return cls(native, fw, cast, bf16, unsupported, mode)

    def info(self, name):
        try:
            return self.infos[name]
        except KeyError:
            raise python_error("tensor_not_found", f"no such tensor among the checkpoint's {len(self.infos)} tensors",
                               file=self.files[0] if len(self.files) == 1 else self.native.path, tensor=name) from None

    def spec(self, name, *, ranges=None, shape=None, slot=None):
        """(the extension's read spec, the TensorPlan) of tensor `name`."""
        info = self.info(name)
        plan = plan_tensor(name, info.dtype, self.fw, cast=self.cast, bf16=self.bf16, unsupported=self.unsupported,
                           file=self.files[info.file], shape=info.shape if ranges is None else None)
        # numpy refuses arrays whose dimensions multiply (zeros left out) past 2**63 bytes, even
        # empty ones; the extension checks that, with the file and tensor, before any read.
        spec = {"key": name, "cast": plan.cast, "view": plan.view, "ranges": ranges, "shape": shape, "name": slot,
                "numpy": self.fw == "np"}
        return spec, plan

    device = "cpu"  # where delivered tensors go: eredu loads into CPU memory, torch moves them on

    def convert(self, tensors, plans):
        out = [to_framework(t, self.fw, p.post) for t, p in zip(tensors, plans)]
        if self.device != "cpu":
            out = [t.to(self.device) for t in out]
        return out

    def start_read(self, names):
        specs, plans = zip(*(self.spec(n) for n in names)) if names else ((), ())
        return self.native.read(list(specs), self.verify), list(plans)

    def read(self, names, progress=None):
        op, plans = self.start_read(names)
        out = dict(zip(names, self.convert(_bridge.wait(op, progress), plans)))
        _bridge.done(op, progress)
        return out

    async def aread(self, names, progress=None):
        op, plans = self.start_read(names)
        out = dict(zip(names, self.convert(await _bridge.wait_async(op, progress), plans)))
        _bridge.done(op, progress)
        return out

    def start_slice(self, name, index):
        info = self.info(name)
        ranges, shape = selection(index, info.shape, name=name, file=self.files[info.file])
        spec, plan = self.spec(name, ranges=ranges, shape=shape)
        return self.native.read([spec], self.verify), plan


class safe_open:
    """A checkpoint opened the way safetensors' `safe_open` opens one (see the module comment).

    safe_open(filename, framework="np", device="cpu", *, dtype=None, bf16=None, unsupported="error",
              budget=None, threads=None, ...)

    `filename` (a str, bytes or os.PathLike: any name the file system holds) may be a `.safetensors` file, a directory (one file, or a sharded checkpoint with
    `model.safetensors.index.json`) or an index file. `framework` is "np"/"numpy" or
    "pt"/"torch"/"pytorch"; `device` must be the CPU. `dtype` ("float32", "float16", "bfloat16" or
    a numpy/torch dtype) converts float tensors on load; `bf16` ("uint16" or "float32") says how
    numpy receives BF16; `unsupported="raw"` gives the bytes of dtypes the framework cannot hold;
    `verify` checks every read against the recorded digests (False: never; None: those recorded;
    True: every read must be verifiable — a slice is only with a shard digest). `backend` is
    safetensors' ("mmap", its default, or "pread"): eredu._options.backend_options says what each
    means in eredu. Once closed, every method raises InvalidArgumentError "File is closed".
    `readahead` (bytes, or "256M"; default 0: off) lets get_tensor read up to that many bytes
    ahead when the names asked for follow keys() or offset_keys() order (eredu._read_ahead).
    The other keywords are eredu's options (eredu._options: staging budget, threads, reader, ...).
    """

    def __init__(self, filename, framework="np", device="cpu", *, dtype=None, bf16=None, unsupported="error",
                 verify=False, readahead=None, **options):
        target = check_device(device, check_framework(framework))
        limit = parse_size("readahead", readahead)
        self._reader = _Reader.open(filename, framework, dtype, bf16, unsupported, copy_resident=False, verify=verify,
                                    **options)
        self._reader.device = target
        self._ahead = ReadAhead(self._reader, DEFAULT_LIMIT if limit is None else limit)
        self._closed = False

    # --- context manager ---
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Closes the files (reads in flight finish first; what get_tensor read ahead is
        cancelled and freed). Tensors already read stay valid."""
        if not self._closed:
            self._closed = True
            self._ahead.discard()
            self._reader.native.close()

    def __del__(self):
        reader = getattr(self, "_reader", None)
        if reader is not None and not getattr(self, "_closed", True):
            self._ahead.discard(wait=False)
            reader.native.close()

    def _check(self):
        # safetensors' words: every method of a closed safe_open raises "File is closed" (here an
        # InvalidArgumentError, a ValueError, as Python's own closed files raise).
        if self._closed:
            raise python_error("invalid_argument", "File is closed", file=self._reader.native.path)

    # --- safetensors' API ---
    def keys(self):
        """Tensor names, sorted (as safetensors)."""
        self._check()
        return sorted(self._reader.order)

    def offset_keys(self):
        """Tensor names in file order (file, then offset)."""
        self._check()
        return list(self._reader.order)

    def metadata(self):
        """The checkpoint's metadata (a file's __metadata__, or the index's), or None when there is none."""
        self._check()
        m = self._reader.native.metadata()
        return m or None

    def get_tensor(self, name, *, progress=None):
        """Reads tensor `name` whole. With `readahead=`, called in keys() or offset_keys() order,
        the next tensors' reads start while the caller works on this one."""
        self._check()
        return self._ahead.get(name, _bridge.check_progress(progress))

    def get_tensors(self, *, progress=None):
        """Every tensor, {name: tensor} in file order (as safetensors' offset_keys()), read as one
        unit: the reads and conversions of all of them run concurrently; all or nothing.
        `progress` as load()'s."""
        return self.load(progress=progress)

    def get_slice(self, name):
        """A lazy view of tensor `name`: index it to read only the selected bytes."""
        self._check()
        self._reader.info(name)
        return Slice(self, name)

    # --- eredu's additions ---
    def tensor_info(self, name):
        """dtype, shape, bytes, file and offset of tensor `name`."""
        self._check()
        return self._reader.info(name)

    def load(self, names=None, *, progress=None):
        """Reads `names` (default: every tensor) as one unit: concurrent reads and conversions; all
        or nothing. A dict in the order given (file order by default). `progress(done, total,
        phase)` is called from this thread as the bytes land (eredu._bridge says when)."""
        self._check()
        _bridge.check_progress(progress)
        return self._reader.read(list(self._reader.order if names is None else names), progress)

    async def aget_tensor(self, name, *, progress=None):
        """get_tensor, awaitable (without read-ahead)."""
        self._check()
        return (await self._reader.aread([name], _bridge.check_progress(progress)))[name]

    async def aload(self, names=None, *, progress=None):
        """load, awaitable; `progress` is called on the asyncio loop's thread."""
        self._check()
        _bridge.check_progress(progress)
        return await self._reader.aread(list(self._reader.order if names is None else names), progress)

    def staging(self):
        """The staging pool's budget, bytes in use, high-water mark and waiters."""
        self._check()
        return self._reader.native.staging()

    @property
    def path(self):
        return self._reader.native.path

    @property
    def files(self):
        """The checkpoint's files (one, or every shard)."""
        self._check()
        return list(self._reader.files)

    def __len__(self):
        self._check()
        return len(self._reader.order)

    def __contains__(self, name):
        self._check()
        return name in self._reader.infos

    def __repr__(self):
        state = "closed" if self._closed else f"{len(self)} tensors"
        return f"<eredu.safe_open {self.path!r} framework={self._reader.fw!r} ({state})>"


class Slice:
    """safetensors' PySafeSlice: shape and dtype without reading; `[...]` reads the selected bytes."""

    def __init__(self, owner, name):
        self._owner = owner
        self._name = name
        self._info = owner._reader.info(name)

    def get_shape(self):
        return list(self._info.shape)

    def get_dtype(self):
        """The safetensors dtype name ("F32", "BF16", ...)."""
        return self._info.dtype

    @property
    def shape(self):
        return tuple(self._info.shape)

    @property
    def ndim(self):
        return len(self._info.shape)

    def __len__(self):
        if not self._info.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._info.shape[0]

    def __getitem__(self, index):
        self._owner._check()
        reader = self._owner._reader
        op, plan = reader.start_slice(self._name, index)
        return reader.convert(_bridge.wait(op), [plan])[0]

    async def aread(self, index=()):
        """`slice[index]`, awaitable."""
        self._owner._check()
        reader = self._owner._reader
        op, plan = reader.start_slice(self._name, index)
        return reader.convert(await _bridge.wait_async(op), [plan])[0]

    def __repr__(self):
        return f"<eredu.Slice {self._name!r} {self._info.dtype} {list(self._info.shape)}>"
