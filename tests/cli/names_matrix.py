#!/usr/bin/env python3
"""The names matrix: every verb that takes a checkpoint (inspect, read, load, pipeline, swap,
checksum; gen, which writes one) on paths and tensor names holding any bytes a file system or
a checkpoint allows, in text and with --json. docs/reliability.md ("Names") states what each
cell must show:

  * exit 0, or exit 1 with a typed error (an eredu::Error kind, `[kind]` on stderr or
    `error.kind` in the document) — never a crash, a hang or a usage error;
  * no raw ESC, NUL, DEL, C1 control, newline-inside-a-name or non-UTF-8 byte of a name in
    stdout or stderr (the raw bytes are checked), and text output that is valid UTF-8;
  * with --json, stdout is exactly one line, one JSON document, valid UTF-8 (decoded
    strictly), whose names read as docs/cli.md's rule says (inspect: every tensor name and
    the path, a byte that is not UTF-8 as the four characters \\xNN).

    names_matrix.py EREDU_BINARY

Prints the number of cells, one line per failing cell, and `N passed, N failed` last; exit
status 1 when a cell failed.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

EREDU = os.path.abspath(sys.argv[1])
VERBS = ["inspect", "read", "load", "pipeline", "swap", "checksum"]
NAME_MAX = os.pathconf("/", "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
PATH_MAX = 4096
TIMEOUT = 120
# Bytes no output may hold raw: ESC, NUL, DEL and the C1 controls as UTF-8 (U+0080..U+009F).
RAW_CONTROLS = [b"\x1b", b"\x00", b"\x7f"] + [bytes([0xC2, b]) for b in range(0x80, 0xA0)]
# An eredu::Error's message ends with its kind in brackets, then the OS's message if it has one.
TYPED = re.compile(rb"\[([a-z_]+)\]( \(.*\))?\s*$")


def fs(path):
    """A path as bytes (every path here may hold bytes that are not UTF-8)."""
    return path if isinstance(path, bytes) else os.fsencode(path)


def json_text(raw):
    """What docs/cli.md's rule makes of `raw` bytes in a document: the text, each byte that is
    not UTF-8 as the four characters \\xNN (what eredu::printable writes too)."""
    return raw.decode("utf-8", "backslashreplace")


# --- checkpoints written by hand ------------------------------------------------------------

def f32(n, seed):
    return b"".join(struct.pack("<f", ((i * 7 + seed) % 13) / 16.0) for i in range(n))


def write_safetensors(path, tensors):
    """tensors: [(name str, [rows, cols]), ...] as F32. The header is JSON, so a name may hold
    any character, control characters written as \\u escapes."""
    header, data = {}, b""
    for i, (name, shape) in enumerate(tensors):
        n = 1
        for d in shape:
            n *= d
        blob = f32(n, i)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    with open(fs(path), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def gguf_string(b):
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, tensors, kv=()):
    """tensors: [(name bytes, [rows, cols]), ...] as F32 (GGUF names are raw bytes, no UTF-8
    required); kv: [(key bytes, value bytes)] as STRING values."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, value in kv:
        out += gguf_string(key) + struct.pack("<I", 8) + gguf_string(value)
    blobs, offset = [], 0
    for i, (name, shape) in enumerate(tensors):
        ne = list(reversed(shape))  # ggml's order: innermost first
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        n = 1
        for d in shape:
            n *= d
        blob = f32(n, i)
        out += struct.pack("<IQ", 0, offset)  # F32
        blobs.append(blob + b"\0" * (-len(blob) % 32))
        offset += len(blobs[-1])
    out += b"\0" * (-len(out) % 32)
    with open(fs(path), "wb") as f:
        f.write(out + b"".join(blobs))


# --- the cases ------------------------------------------------------------------------------

class Case:
    """A checkpoint to run every verb on: its path, the byte strings no output may hold raw,
    the tensor names inspect --json must list (raw bytes), and whether it must load."""

    def __init__(self, label, path, forbidden=(), names=None, loads=True):
        self.label, self.path, self.forbidden, self.names, self.loads = label, fs(path), list(forbidden), names, loads


def make_cases(tmp):
    tmp = fs(tmp)
    base = os.path.join(tmp, b"base.safetensors")
    base_gguf = os.path.join(tmp, b"base.gguf")
    for out, extra in ((base, []), (base_gguf, ["--format", "gguf", "--dtype", "f32"])):
        p = subprocess.run([EREDU, "gen", out, "--size", "64K", "-q", *extra], capture_output=True, timeout=TIMEOUT)
        if p.returncode != 0:
            raise SystemExit(f"eredu gen failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
    cases, gens, setup_failures = [], [], []

    # Paths the OS accepts with any bytes (NUL is the one it cannot hold).
    suffix = b".safetensors"
    long_name = b"n" * (NAME_MAX - len(suffix)) + suffix
    # Room past the checkpoint's path for what eredu adds to it: a sidecar's ".sha256.json.tmp",
    # gen's ".eredu-gen-<pid>.partial" beside it.
    deep, want = tmp, PATH_MAX - 60
    while len(deep) + 1 + 200 < want - len(b"/ck.safetensors"):
        deep = os.path.join(deep, b"d" * 200)
    deep = os.path.join(deep, b"e" * max(1, want - len(deep) - 1 - len(b"/ck.safetensors") - 1))
    os.makedirs(deep)
    paths = [
        ("path not UTF-8", b"ck-\xff\xfe.safetensors", [b"\xff\xfe"]),
        ("path with a newline", b"ck\nrow.safetensors", [b"ck\nrow"]),
        ("path with ESC", b"ck\x1b[31mred\x1b[0m.safetensors", [b"\x1b[31m"]),
        ("path with DEL and C1 CSI", b"ck\x7f\xc2\x9b2J.safetensors", [b"\x7f", b"\xc2\x9b"]),
        ("path with U+2028", "ck\u2028sep.safetensors".encode(), []),
        ("path with spaces", b"my model v2.safetensors", []),
        ("path with a leading dash", b"-ck.safetensors", []),
        (f"name of NAME_MAX ({NAME_MAX}) bytes", long_name, []),
    ]
    for label, name, forbidden in paths:
        target = os.path.join(tmp, name)
        shutil.copyfile(base, target)
        cases.append(Case(label, target, forbidden))
        stem, ext = os.path.splitext(name)
        gen_name = stem + b"-gen" + ext if len(name) + 4 <= NAME_MAX else b"g" * (NAME_MAX - len(suffix)) + suffix
        gens.append((label, os.path.join(tmp, gen_name), forbidden))
    target = os.path.join(deep, b"ck.safetensors")
    shutil.copyfile(base, target)
    cases.append(Case(f"path of {len(target)} bytes (PATH_MAX {PATH_MAX})", target))
    gens.append((f"path of {len(target)} bytes", os.path.join(deep, b"gen.safetensors"), []))

    gguf_path = os.path.join(tmp, b"g-\xff\n\x1b.gguf")
    shutil.copyfile(base_gguf, gguf_path)
    cases.append(Case("GGUF path not UTF-8, newline, ESC", gguf_path, [b"\xff\n", b"\n\x1b"]))
    gens.append(("GGUF path not UTF-8, newline, ESC", os.path.join(tmp, b"gen-\xff\n\x1b.gguf"), [b"\xff\n"]))

    sharded = os.path.join(tmp, b"dir-\xfe\n\x1b[2J")
    p = subprocess.run([EREDU, "gen", sharded, "--size", "64K", "--shards", "2", "-q"], capture_output=True,
                       timeout=TIMEOUT)
    if p.returncode == 0:
        cases.append(Case("sharded directory not UTF-8, newline, ESC", sharded, [b"\xfe\n", b"\x1b[2J"]))
    else:
        setup_failures.append(f"eredu gen of a sharded checkpoint into {sharded!r} failed ({p.returncode}): "
                              f"{p.stderr[-300:]!r}")
    gens.append(("sharded directory not UTF-8, newline, ESC", os.path.join(tmp, b"gdir-\xfe\n\x1b"), [b"\xfe\n"]))

    # Tensor names: safetensors headers are JSON, so any character; each class on its own.
    def st_names(label, odd, forbidden):
        names = [f"model.layers.0.{odd}.weight", "model.layers.0.mlp.weight", f"model.layers.1.x{odd}",
                 "model.layers.1.mlp.weight"]
        path = os.path.join(tmp, label.replace(" ", "-").encode() + b".safetensors")
        write_safetensors(path, [(names[0], [8, 16]), (names[1], [8, 16]), (names[2], [4]), (names[3], [8, 16])])
        cases.append(Case(f"tensor names with {label}", path, forbidden, [n.encode() for n in names]))

    st_names("ESC", "esc\x1b[2J", [b"\x1b[2J"])
    st_names("NUL", "nul\x00z", [b"nul\x00z"])
    st_names("a newline", "nl\nrow", [b"nl\nrow"])
    st_names("DEL and C1", "del\x7fcsi\x9b", [b"\x7f", b"\xc2\x9b"])
    st_names("U+2028", "ls\u2028sep", [])

    # GGUF names are raw bytes: not UTF-8 too; a NUL, which ggml would cut the name at, is refused.
    def gguf_names(label, odd, forbidden, kv=(), loads=True):
        names = [b"blk.0." + odd + b".weight", b"blk.0.ffn.weight", b"blk.1.x" + odd, b"blk.1.ffn.weight"]
        path = os.path.join(tmp, label.replace(" ", "-").encode() + b".gguf")
        write_gguf(path, [(names[0], [8, 16]), (names[1], [8, 16]), (names[2], [4]), (names[3], [8, 16])], kv)
        cases.append(Case(f"GGUF tensor names with {label}", path, forbidden, names, loads))

    gguf_names("bytes not UTF-8", b"\xff\xfe", [b"\xff\xfe", b"\xc0"],
               kv=[(b"general.architecture", b"llama"), (b"general.name", b"n\xc0\x1b[2Jame"),
                   (b"general.\xc0key", b"v")])
    gguf_names("controls", b"esc\x1b[2Jnl\nrow\x7f\xe2\x80\xa8", [b"\x1b[2J", b"nl\nrow", b"\x7f"])
    gguf_names("NUL", b"a\x00b", [b"a\x00b"], loads=False)
    return cases, gens, setup_failures


# --- running a cell -------------------------------------------------------------------------

def command(verb, path, json_out):
    opts = ["--json"] if json_out else []
    if verb == "load":
        opts += ["--threads", "1"]
    elif verb == "pipeline":
        opts += ["--threads", "1"]
    elif verb == "swap":
        opts += ["--swaps", "1", "--requests", "20", "--concurrency", "2"]
    elif verb == "gen":
        opts += ["--size", "64K"] + (["--format", "gguf", "--dtype", "f32"] if path.endswith(b".gguf") else [])
    args = [path, path] if verb == "swap" else [path]
    # A path that starts with '-' comes after `--`, as for any command of its kind.
    sep = ["--"] if os.path.basename(path).startswith(b"-") else []
    return [EREDU.encode(), verb.encode(), *[o.encode() for o in opts], *sep, *args]


def check_cell(verb, case, json_out, argv):
    """Runs one cell; returns the list of what is wrong with it."""
    problems = []
    try:
        p = subprocess.run(argv, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return [f"no exit within {TIMEOUT} s (a hang)"]
    out, err, rc = p.stdout, p.stderr, p.returncode
    if rc < 0 or rc > 2:
        problems.append(f"exit {rc} (a crash or signal)")
    elif rc == 2:
        problems.append("exit 2: a usage error for a path the OS accepts")
    elif rc == 1 and case.loads and verb != "checksum" and verb != "gen":
        # Only checksum (a sidecar name past NAME_MAX, a GGUF name JSON cannot hold) and gen
        # (a temporary name past NAME_MAX) may fail on a checkpoint that loads.
        problems.append("exit 1 on a checkpoint that loads")
    elif rc == 0 and not case.loads:
        problems.append("exit 0 on a checkpoint that must be refused")
    for stream, data in (("stdout", out), ("stderr", err)):
        for bad in RAW_CONTROLS + case.forbidden:
            if bad in data:
                at = data.index(bad)
                problems.append(f"{stream} holds raw {bad!r} at byte {at}: {data[max(0, at - 40):at + 40]!r}")
                break
        if not json_out or stream == "stderr":
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as e:
                problems.append(f"{stream} is not UTF-8 ({e.reason} at byte {e.start}): "
                                f"{data[max(0, e.start - 40):e.start + 40]!r}")
    if rc == 1 and not json_out:
        last = err.rstrip(b"\n").split(b"\n")[-1] if err.strip() else b""
        m = TYPED.search(last)
        if not m or m.group(1) == b"failure":
            problems.append(f"exit 1 without a typed error: stderr ends {last[-200:]!r}")
    if json_out:
        try:
            text = out.decode("utf-8")  # strict
        except UnicodeDecodeError as e:
            return problems + [f"--json stdout is not UTF-8 ({e.reason} at byte {e.start})"]
        if not text.endswith("\n") or text.count("\n") != 1:
            problems.append(f"--json stdout is {text.count(chr(10))} lines, not one: {text[:200]!r}")
        if "\u2028" in text or "\u2029" in text:
            problems.append("--json stdout holds a raw U+2028 or U+2029")
        try:
            doc = json.loads(text)
        except ValueError as e:
            return problems + [f"--json stdout is not one JSON document: {e}: {text[:300]!r}"]
        if not isinstance(doc, dict) or doc.get("schema") != 1 or doc.get("command") != verb:
            problems.append(f"--json document lacks schema 1 or command {verb!r}: {text[:200]!r}")
            return problems
        error = doc.get("error")
        if rc == 1:
            if not isinstance(error, dict) or not error.get("kind") or error.get("kind") == "failure":
                problems.append(f"exit 1 without a typed error in the document: {error!r}")
        elif rc == 0 and error:
            problems.append(f"exit 0 with an error in the document: {error!r}")
        if rc == 0 and verb == "inspect":
            if doc.get("path") != json_text(case.path):
                problems.append(f"inspect --json path is {doc.get('path')!r}, not {json_text(case.path)!r}")
            if case.names is not None:
                got = sorted(t["name"] for t in doc.get("tensors", []))
                want = sorted(json_text(n) for n in case.names)
                if got != want:
                    problems.append(f"inspect --json names are {got!r}, not {want!r}")
    return problems


def main():
    tmp = tempfile.mkdtemp(prefix="eredu-names-")
    started = time.monotonic()
    try:
        cases, gens, setup_failures = make_cases(tmp)
        cells = []
        for case in cases:
            for verb in VERBS:
                for json_out in (False, True):
                    cells.append((verb, case, json_out, command(verb, case.path, json_out)))
        for label, out, forbidden in gens:
            for json_out in (False, True):
                # Each run writes its own file: the text run's would make the --json run's a
                # refused existing checkpoint.
                stem, ext = os.path.splitext(out)
                if json_out:
                    stem = stem[:-1] + b"J" if len(os.path.basename(out)) >= NAME_MAX else stem + b"J"
                target = stem + ext
                cells.append(("gen", Case(label, target, forbidden), json_out, command("gen", target, json_out)))
        print(f"names matrix: {len(cells)} cells ({len(cases)} checkpoints x {len(VERBS)} verbs x text, --json; "
              f"gen to {len(gens)} paths x text, --json)", flush=True)
        passed, failed = 0, len(setup_failures)
        for f in setup_failures:
            print(f"FAIL setup: {f}", flush=True)
        for verb, case, json_out, argv in cells:
            problems = check_cell(verb, case, json_out, argv)
            if problems:
                failed += 1
                print(f"FAIL {verb}{' --json' if json_out else ''} on {case.label}:", flush=True)
                for p in problems:
                    print(f"    {p}", flush=True)
            else:
                passed += 1
        print(f"({time.monotonic() - started:.0f} s)")
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
