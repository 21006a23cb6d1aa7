# Inputs a caller, a file system or the system's limits may throw at eredu (issue 30, "never hang,
# never abort"): paths of any bytes, integer options out of range, valid tensors whose shapes numpy
# or torch cannot hold, and processes short of threads, descriptors, address space or lockable
# memory. Each is served, or refused with an eredu.Error naming what was wrong: never an untyped
# exception, a crash or a hang.
import asyncio
import hashlib
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import eredu
from eredu import _native

# --- paths of any bytes -------------------------------------------------------------------------

# Linux names are bytes: these are a name that is not UTF-8, names with a newline and a terminal
# escape (which an unescaped message would act on), a space, and a leading dash (an option to a
# command line).
HOSTILE_NAMES = {
    "not-utf8": b"caf\xe9-\xff",
    "newline": b"new\nline",
    "escape": b"esc\x1b[31m",
    "space": b"with space",
    "dash": b"-leading",
}


class BytesPathLike:
    """An os.PathLike whose __fspath__ gives bytes (pathlib only ever gives str)."""

    def __init__(self, raw):
        self.raw = raw

    def __fspath__(self):
        return self.raw


FORMS = {
    "str": os.fsdecode,  # surrogate escapes for the bytes that are not UTF-8
    "bytes": lambda raw: raw,
    "pathlib": lambda raw: pathlib.Path(os.fsdecode(raw)),
    "pathlike-bytes": BytesPathLike,
}

LAYERS = {f"model.layers.{i}.w": np.arange(i * 24, (i + 1) * 24, dtype=np.float32).reshape(4, 6) for i in range(3)}


def _digests(arrays):
    return {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in arrays.items()}


@pytest.fixture
def hostile_checkpoints(tmp_path, writer):
    """{name: (directory bytes, file bytes)}: a directory named by each hostile name holding a
    checkpoint of the same name and its digest sidecar (`<file>.sha256.json`)."""
    out = {}
    base = os.fsencode(tmp_path)
    for key, name in HOSTILE_NAMES.items():
        directory = os.path.join(base, name)
        os.mkdir(directory)
        file = os.path.join(directory, name + b".safetensors")
        writer(os.fsdecode(file), LAYERS)
        with open(file + b".sha256.json", "w") as f:
            json.dump(_digests(LAYERS), f)
        out[key] = (directory, file)
    return out


def _entry_points(path, verify):
    """(name, call) for every public entry point that takes a checkpoint path; each call returns the
    tensors it loaded, by name."""

    def safe_open():
        with eredu.safe_open(path, verify=verify) as f:
            got = {k: f.get_tensor(k) for k in f.keys()}
            if verify is not True:  # a slice is verifiable only with a digest of that shard
                rows = f.get_slice("model.layers.1.w")[1:3]
                np.testing.assert_array_equal(rows, LAYERS["model.layers.1.w"][1:3])
            assert f.path == os.fsdecode(os.fspath(path)) and all(isinstance(p, str) for p in f.files)
            return got

    async def aread_all():
        return {k: await eredu.aread(path, k, verify=verify) for k in LAYERS}

    def prefetch():
        got = {}
        with eredu.prefetch(path, lookahead=1, verify=verify) as p:
            for unit in p:
                got.update(unit.items())
        return got

    def model_slot():
        slot = eredu.ModelSlot(path, verify=verify) if path is not None else eredu.ModelSlot()  # None: empty
        slot.swap_sync(path, verify=verify)
        assert slot.current().origin == os.fsdecode(os.fspath(path))
        asyncio.run(slot.swap(path, verify=verify))
        assert slot.generation == 3
        return dict(slot.current().items())

    return [
        ("load_file", lambda: eredu.load_file(path, verify=verify)),
        ("aload", lambda: asyncio.run(eredu.aload(path, verify=verify))),
        ("aread", lambda: asyncio.run(aread_all())),
        ("safe_open", safe_open),
        ("prefetch", prefetch),
        ("ModelSlot", model_slot),
    ]


def _assert_printable(e):
    """The message of `e` is one line that prints anywhere: valid UTF-8, no control character."""
    message = str(e)
    message.encode("utf-8")  # raises on a lone surrogate
    assert not any(ord(c) < 0x20 or c == "\x7f" for c in message), repr(message)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_every_entry_point_opens_a_path_of_any_bytes(hostile_checkpoints, name, form):
    directory, file = hostile_checkpoints[name]
    # The file verified against its sidecar (the sidecar's path is as hostile), and the directory.
    for path, verify in ((FORMS[form](file), True), (FORMS[form](directory), None)):
        for entry, call in _entry_points(path, verify):
            got = call()
            assert set(got) == set(LAYERS), entry
            for k, v in LAYERS.items():
                np.testing.assert_array_equal(got[k], v, err_msg=f"{entry} {k}")


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_errors_about_hostile_paths_are_typed_and_printable(hostile_checkpoints, name):
    directory, file = hostile_checkpoints[name]
    missing = os.path.join(directory, b"missing-" + HOSTILE_NAMES[name])
    for form in FORMS.values():
        for entry, call in _entry_points(form(missing), None):
            with pytest.raises(eredu.Error) as e:
                call()
            assert isinstance(e.value, (eredu.IoError, eredu.FormatError)), (entry, repr(e.value))
            _assert_printable(e.value)
            assert e.value.file == os.fsdecode(missing), entry  # the raw name, os.fsdecode's spelling
    # Errors the Python layer composes escape the same way.
    with eredu.safe_open(file) as f:
        with pytest.raises(eredu.TensorNotFoundError) as e:
            f.get_tensor("no\nsuch\x1b[0m")
        _assert_printable(e.value)
        assert e.value.file == os.fsdecode(file) and e.value.tensor == "no\nsuch\x1b[0m"
        assert "no\\nsuch\\x1b[0m" in str(e.value)


@pytest.mark.parametrize("path, words", [
    (b"/tmp/nul\0byte", "NUL byte"),
    ("/tmp/nul\0byte", "NUL byte"),
    (3, "must be a str, bytes or os.PathLike"),
    (None, "must be a str, bytes or os.PathLike"),
    ("/tmp/\ud800", "cannot be encoded"),  # a surrogate that escapes no byte
])
def test_what_is_no_path_is_an_invalid_argument(path, words):
    for entry, call in _entry_points(path, None):
        with pytest.raises(eredu.InvalidArgumentError, match=words):
            call()
    with pytest.raises(eredu.InvalidArgumentError, match=words.split()[0]):
        _native.open(path, {})  # the extension's own check, for callers below the package


# --- integer options ----------------------------------------------------------------------------

OUT_OF_RANGE = [2**70, 2**64, 2**63, -1, 0, True, False, 1.5]
OPEN_OPTIONS = ["budget", "threads", "depth", "request", "chunk"]


def _option_calls(path):
    """(entry, option, call(value)) for every integer option of every entry point."""
    calls = []
    for option in OPEN_OPTIONS:
        calls += [
            ("load_file", option, lambda v, o=option: eredu.load_file(path, **{o: v})),
            ("aload", option, lambda v, o=option: asyncio.run(eredu.aload(path, **{o: v}))),
            ("aread", option, lambda v, o=option: asyncio.run(eredu.aread(path, "model.layers.0.w", **{o: v}))),
            ("safe_open", option, lambda v, o=option: eredu.safe_open(path, **{o: v})),
            ("prefetch", option, lambda v, o=option: eredu.prefetch(path, **{o: v})),
            ("ModelSlot", option, lambda v, o=option: eredu.ModelSlot(path, **{o: v})),
            ("swap_sync", option, lambda v, o=option: eredu.ModelSlot().swap_sync(path, **{o: v})),
            ("swap", option, lambda v, o=option: asyncio.run(eredu.ModelSlot().swap(path, **{o: v}))),
        ]
    for option in ("lookahead", "passes", "concurrent_loads", "staging"):
        calls.append(("prefetch", option, lambda v, o=option: eredu.prefetch(path, **{o: v})))
    calls.append(("set_storage_retention", "nbytes", eredu.set_storage_retention))
    calls.append(("trim_storage", "keep", eredu.trim_storage))
    return calls


def test_integer_options_out_of_range_are_invalid_arguments_naming_the_range(tmp_path, writer):
    path = writer(tmp_path / "m.safetensors", LAYERS)
    cells = 0
    for entry, option, call in _option_calls(path):
        for value in OUT_OF_RANGE:
            if option in ("nbytes", "keep") and value in (0, 2**63):
                continue  # byte counts in 64 bits: these are in range (False == 0 is refused below)
            with pytest.raises(eredu.InvalidArgumentError) as e:
                call(value)
            message = str(e.value)
            assert option in message and " from " in message and e.value.kind == "invalid_argument", \
                (entry, option, value, message)
            cells += 1
    assert cells > 300
    with pytest.raises(eredu.InvalidArgumentError, match="nbytes must be a number of bytes from 0 to"):
        eredu.set_storage_retention(False)
    # Bools where a bool is odd, and a number where a bool is meant.
    with pytest.raises(eredu.InvalidArgumentError, match="verify must be"):
        eredu.load_file(path, verify=1)
    with pytest.raises(eredu.InvalidArgumentError, match="map_resident must be True or False"):
        eredu.load_file(path, map_resident=1)
    # The extension refuses what its C++ types cannot hold, for callers below the package.
    for value in (2**70, 2**64, -1, 0, True):
        with pytest.raises(eredu.InvalidArgumentError, match="option threads: must be an integer from 1 to"):
            _native.open(os.fsencode(path), {"threads": value})
    # The ends of the ranges are accepted.
    np.testing.assert_array_equal(
        eredu.load_file(path, budget=4096, threads=1024, depth=256, request=1 << 30, chunk=4096)["model.layers.2.w"],
        LAYERS["model.layers.2.w"])
    assert eredu.load_file(path, budget="1T", threads=np.int64(1), depth=1)["model.layers.0.w"].shape == (4, 6)


# --- tensors numpy or torch cannot hold ---------------------------------------------------------

@pytest.fixture
def empty_giants(tmp_path, writer):
    """Valid tensors without elements (0 bytes: the reference parser accepts any dimensions beside
    a 0) whose dimensions reach past int64, and an ordinary one."""
    return writer(tmp_path / "giants.safetensors", {
        "huge": ("F32", [0, 2**63, 2**63], b""),   # past int64: no framework holds it
        "wide": ("F32", [0, 2**63 - 1, 2], b""),  # int64 dims: torch holds it; numpy's size check refuses it
        "fits": ("F32", [0, 2**40, 2], b""),
        "w": np.arange(4, dtype=np.float32),
    })


def _assert_refused(e, path, tensor):
    assert isinstance(e, eredu.FormatError) and e.kind == "size_overflow", repr(e)
    assert e.file == str(path) and e.tensor == tensor and tensor in str(e) and "2^63-1" in str(e)


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_empty_tensors_with_huge_dimensions(empty_giants, framework):
    if framework == "pt":
        torch = pytest.importorskip("torch")
    path = empty_giants
    held = {"fits": (0, 2**40, 2)} if framework == "np" else {"fits": (0, 2**40, 2), "wide": (0, 2**63 - 1, 2)}
    with eredu.safe_open(path, framework) as f:
        for name in ("huge", "wide", "fits"):
            if name in held:
                t = f.get_tensor(name)
                assert tuple(t.shape) == held[name]
                if framework == "np":
                    assert t.size == 0 and t.dtype == np.float32
                else:
                    assert t.numel() == 0 and t.dtype == torch.float32
            else:
                with pytest.raises(eredu.FormatError) as e:
                    f.get_tensor(name)
                _assert_refused(e.value, path, name)
        # A slice of the giant is an ordinary empty tensor.
        assert tuple(f.get_slice("huge")[:, :3, 5:7].shape) == (0, 3, 2)
        one = asyncio.run(eredu.aread(path, "huge", index=(slice(None), slice(0, 3), 0), framework=framework))
        assert tuple(one.shape) == (0, 3)
        assert set(f.load(["fits", "w"])) == {"fits", "w"}
    # A whole load is all or nothing: refused before any read, naming the tensor.
    with pytest.raises(eredu.FormatError) as e:
        eredu.load_file(path, framework)
    _assert_refused(e.value, path, "huge")
    with pytest.raises(eredu.FormatError) as e:
        asyncio.run(eredu.aload(path, framework, names=["w", "huge"]))
    _assert_refused(e.value, path, "huge")


# --- the process's limits -----------------------------------------------------------------------

# What each cell runs: every entry point on a small layered checkpoint, under the limit (round 1),
# then again after lifting the soft limit to the hard one (round 2: the module must still serve, or
# refuse the same typed way). It prints one line per call: OK (the right values), TYPED (an
# eredu.Error), or UNTYPED / WRONG (a failure of the cell). Failing to start Python (no CHILD line)
# or numpy, or to map eredu's shared libraries (ImportError), is the system's, before any eredu
# code runs: the cell passes, reported NOSTART. An asyncio loop that cannot be made (ENV) skips
# aload.
CHILD = r"""
print("CHILD", flush=True)  # the interpreter started (the dynamic loader and site import may fail first)
import sys
try:
    import asyncio, resource
    import numpy as np
except BaseException as e:
    print("NOSTART", type(e).__name__, e, flush=True)
    raise SystemExit(0)
try:
    import eredu
except (ImportError, MemoryError, OSError) as e:
    print("NOSTART eredu", type(e).__name__, e, flush=True)
    raise SystemExit(0)

path, limit, with_lock = sys.argv[1], getattr(resource, sys.argv[2]), sys.argv[3] == "1"
N = 4096
want = {f"model.layers.{i}.w": np.arange(i * N, (i + 1) * N, dtype=np.float32) for i in range(4)}

def same(got):
    return set(got) == set(want) and all(np.array_equal(got[k], v) for k, v in want.items())

def safe_open():
    with eredu.safe_open(path) as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        got["model.layers.1.w"] = np.concatenate([f.get_slice("model.layers.1.w")[:7], got["model.layers.1.w"][7:]])
        return got

def prefetch():
    got = {}
    with eredu.prefetch(path, lookahead=1) as p:
        for unit in p:
            got.update(unit.items())
    return got

def model_slot():
    slot = eredu.ModelSlot(path)
    slot.swap_sync(path)
    return dict(slot.current().items()) if slot.generation == 2 else {}

steps = [
    ("load_file", lambda loop: eredu.load_file(path)),
    ("safe_open", lambda loop: safe_open()),
    ("aload", lambda loop: loop.run_until_complete(eredu.aload(path))),
    ("prefetch", lambda loop: prefetch()),
    ("ModelSlot", lambda loop: model_slot()),
]
if with_lock:
    steps.append(("map-lock", lambda loop: eredu.load_file(path, weights="map-lock")))

failures = 0
for round in (1, 2):
    if round == 2:
        soft, hard = resource.getrlimit(limit)
        resource.setrlimit(limit, (hard, hard))
    try:
        loop = asyncio.new_event_loop()
    except BaseException as e:
        loop = None
        print(round, "ENV asyncio loop:", type(e).__name__, e, flush=True)
    for name, step in steps:
        if loop is None and name == "aload":
            continue
        try:
            got = step(loop)
        except eredu.Error as e:
            print(round, name, "TYPED", type(e).__name__, e.kind, str(e)[:300], flush=True)
            continue
        except BaseException as e:
            print(round, name, "UNTYPED", type(e).__module__ + "." + type(e).__name__, str(e)[:300], flush=True)
            failures += 1
            continue
        try:
            ok = same(got)
        except MemoryError:  # numpy's comparison, not eredu
            print(round, name, "ENV comparison: MemoryError", flush=True)
            continue
        print(round, name, "OK" if ok else "WRONG", flush=True)
        failures += not ok
    if loop is not None:
        loop.close()
print("DONE", failures, flush=True)
raise SystemExit(1 if failures else 0)
"""

CELL_TIMEOUT_S = 30  # a cell still running then has hung
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _size(text):
    return int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]] if text[-1] in "KMG" else int(text)


# Each sweep: the prlimit option, the values, whether it runs as nobody (RLIMIT_NPROC counts every
# thread of the user; root ignores RLIMIT_MEMLOCK), and whether map-lock is loaded as well.
SWEEPS = {
    "as": ("RLIMIT_AS", ["64M", "96M", "128M", "160M", "192M", "256M", "384M", "512M", "1G", "2G"], False, False),
    "nofile": ("RLIMIT_NOFILE", [str(n) for n in (3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 32, 64)], False, False),
    "memlock": ("RLIMIT_MEMLOCK", ["0", "4K", "16K", "64K", "256K", "8M"], True, True),
    "nproc": ("RLIMIT_NPROC", [str(n) for n in range(1, 33)], True, False),
}
CELLS = [(sweep, value) for sweep, (_, values, _, _) in SWEEPS.items() for value in values]


@pytest.fixture(scope="module")
def limit_checkpoint():
    """A checkpoint nobody may read (pytest's tmp_path is private to its user): 4 layers of 16 KiB."""
    from conftest import write_safetensors
    directory = tempfile.mkdtemp(prefix="eredu-limits-")
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "model.safetensors")
    n = 4096
    write_safetensors(path, {f"model.layers.{i}.w": np.arange(i * n, (i + 1) * n, dtype=np.float32) for i in range(4)})
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(directory, ignore_errors=True)


def _child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(eredu.__file__)))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"  # numpy's BLAS would start its own threads at import, and count against NPROC
    return env


def _run_cell(checkpoint, sweep, value):
    """(returncode or None when it hung, output) of one cell."""
    rlimit, _, as_nobody, with_lock = SWEEPS[sweep]
    soft = _size(value)
    hard = resource.getrlimit(getattr(resource, rlimit))[1]
    hard = "unlimited" if hard == resource.RLIM_INFINITY else max(hard, soft)
    command = ["prlimit", f"--{sweep}={soft}:{hard}", "--core=0", "--"]
    if as_nobody:
        command += NOBODY
    command += [sys.executable, "-c", CHILD, checkpoint, rlimit, "1" if with_lock else "0"]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=_child_env(), cwd="/", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=CELL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return None, out.decode(errors="replace")
    return proc.returncode, out.decode(errors="replace")


def _nobody_available(checkpoint):
    if shutil.which("prlimit") is None:
        return "prlimit (util-linux) is missing"
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "running as another user needs root and setpriv (util-linux)"
    probe = subprocess.run(NOBODY + [sys.executable, "-c", "import eredu, sys; open(sys.argv[1], 'rb').close()",
                                     checkpoint], env=_child_env(), cwd="/", capture_output=True, text=True)
    if probe.returncode != 0:
        return f"user nobody cannot import eredu or read the checkpoint here: {probe.stderr.strip()[-300:]}"
    return None


@pytest.mark.parametrize("sweep, value", CELLS, ids=[f"{s}={v}" for s, v in CELLS])
def test_limits_give_the_right_values_or_a_typed_error(limit_checkpoint, sweep, value):
    """One cell of the limit matrix: 61 cells — RLIMIT_AS 64M..2G (10), RLIMIT_NOFILE 3..64 (13),
    RLIMIT_MEMLOCK 0..8M as nobody with weights='map-lock' too (6), RLIMIT_NPROC 1..32 as nobody (32).
    Each cell runs every entry point twice (under the limit, then with it lifted) in a child and
    passes when the child exits 0 within CELL_TIMEOUT_S, every call having returned the right values
    or raised an eredu.Error: no other exception, no signal, no hang."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is missing: cannot set a child's limits")
    if SWEEPS[sweep][2]:
        why = _nobody_available(limit_checkpoint)
        if why:
            pytest.skip(f"{sweep} cells run as user nobody: {why}")
    code, out = _run_cell(limit_checkpoint, sweep, value)
    cell = f"prlimit --{sweep}={value}:\n{out[-3000:]}"
    assert code is not None, f"hung (no exit within {CELL_TIMEOUT_S} s): {cell}"
    if "CHILD" not in out.split("\n") or "\nNOSTART" in out:
        return  # the interpreter, numpy or the loader gave up under the limit before eredu ran
    assert code >= 0, f"killed by signal {-code}: {cell}"
    assert "DONE" in out, f"exit {code} before the end: {cell}"
    assert "UNTYPED" not in out and "WRONG" not in out and code == 0, cell
    # Where the limit leaves room, everything is served.
    if (sweep, value) in (("as", "2G"), ("nofile", "64"), ("memlock", "8M"), ("nproc", "32")):
        assert "TYPED" not in out, f"refused with room to spare: {cell}"


def test_a_refused_thread_is_typed_and_a_later_call_succeeds(limit_checkpoint):
    """RLIMIT_NPROC 1 leaves nobody's process no second thread: starting eredu's event loop fails
    with ResourceExhaustedError, and once the limit is lifted the same process loads."""
    why = _nobody_available(limit_checkpoint)
    if why:
        pytest.skip(why)
    code, out = _run_cell(limit_checkpoint, "nproc", "1")
    assert code == 0, out
    assert "1 load_file TYPED ResourceExhaustedError resource_exhausted" in out, out
    assert "2 load_file OK" in out and "2 ModelSlot OK" in out, out
