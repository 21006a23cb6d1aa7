#!/usr/bin/env python3
"""The `eredu` command as a user meets it: usage errors, help, JSON output and its
vocabulary, `eredu gen`'s rule for OUT, swap verification modes, the progress display, and
docs/cli.md against every command's --help. ctest runs each case as its own test:

    cli_test.py ERDU_BINARY SOURCE_DIR CASE
"""
import fcntl
import hashlib
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import termios

EREDU, SOURCE, CASE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
COMMANDS = ["inspect", "read", "load", "pipeline", "swap", "gen", "checksum"]
failures = []


def run(*args, expect=None, env=None):
    """Runs eredu with args; returns (exit status, stdout, stderr)."""
    p = subprocess.run([EREDU, *args], capture_output=True, text=True, env=env, timeout=300)
    if expect is not None and p.returncode != expect:
        fail(f"eredu {' '.join(args)}: exit {p.returncode}, expected {expect}\nstdout: {p.stdout[-2000:]}\n"
             f"stderr: {p.stderr[-2000:]}")
    return p.returncode, p.stdout, p.stderr


def fail(message):
    failures.append(message)
    print("FAIL:", message, file=sys.stderr)


def check(condition, message):
    if not condition:
        fail(message)


def document(stdout, command):
    """The one JSON line of a --json run, checked for schema and command."""
    lines = [l for l in stdout.splitlines() if l.strip()]
    check(len(lines) == 1, f"{command} --json printed {len(lines)} lines, not one")
    doc = json.loads(lines[-1])
    check(doc.get("schema") == 1, f"{command}: schema is {doc.get('schema')!r}, not 1")
    check(doc.get("command") == command, f"{command}: command is {doc.get('command')!r}")
    return doc


# The unitless numbers docs/cli.md lists (settings, identifiers, dimensions); every other
# number must carry its unit in its name.
UNITLESS = {"schema", "depth", "threads", "concurrency", "lookahead", "serve_threads", "swap_threads", "seed",
            "index", "pass", "generation", "rows", "cols", "hidden", "intermediate", "vocab", "checksum",
            "p99_ratio", "gguf_version", "file_type", "rank", "heads", "kv_heads", "head_dim"}
UNIT_SUFFIXES = ("_bytes", "_seconds", "_gb_per_s", "_count", "_offset")
BARE_UNITS = {"bytes", "seconds", "gb_per_s", "count", "offset"}
LISTS = {"shape"}  # a list whose name is not a plural


def check_vocabulary(value, where):
    """Every key snake_case; numbers named by unit; lists plural (docs/cli.md, "Vocabulary")."""
    if isinstance(value, list):
        for i, v in enumerate(value):
            check_vocabulary(v, f"{where}[{i}]")
        return
    if not isinstance(value, dict):
        return
    for key, v in value.items():
        here = f"{where}.{key}"
        check(re.fullmatch(r"[a-z][a-z0-9_]*", key) is not None, f"{here}: not a snake_case name")
        if key == "metadata":  # the checkpoint's own strings
            continue
        if isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        if isinstance(v, (int, float)):
            check(key in BARE_UNITS or key.endswith(UNIT_SUFFIXES) or key in UNITLESS,
                  f"{here}: a number whose name has no unit (_bytes, _seconds, _gb_per_s, _count, _offset)")
        elif isinstance(v, list):
            check(key.endswith("s") or key in LISTS, f"{here}: a list whose name is not a plural")
        check_vocabulary(v, here)


def gen(path, *extra):
    run("gen", path, "--size", "1M", "-q", *extra, expect=0)


# ---------------------------------------------------------------------------------------

def case_usage(tmp):
    """The reproduced bugs: each is now a usage error (exit 2) that names the option and range."""
    ck = os.path.join(tmp, "ck.safetensors")
    gen(ck)
    cases = [
        (["load", ck, "--threads", "abc"], "--threads", "1 to 1024"),
        (["load", ck, "--threads", "100000"], "--threads", "1 to 1024"),
        (["gen", os.path.join(tmp, "x"), "--seed", "abc"], "--seed", "0 to 18446744073709551615"),
        (["gen", os.path.join(tmp, "x"), "--seed", "-1"], "--seed", "0 to 18446744073709551615"),
        (["pipeline", ck, "--lookahead", "abc"], "--lookahead", "1 to 64"),
        (["pipeline", ck, "--units", "blk"], "--units", "layers, experts"),
        (["load", ck, "--repeat", "2x"], "--repeat", "1 to 1000"),
        (["gen", os.path.join(tmp, "x"), "--shards", "-1"], "--shards", "1 to 99999"),
        (["read", ck, "--budget", "1e30"], "--budget", "4K to 1T"),
        (["load", ck, "--depth", "-1"], "--depth", "1 to 256"),
        (["read", ck, "--reader", "pread", "--depth", "100000"], "--depth", "1 to 256"),
        (["read", ck, "--reader", "io_uring"], "--reader", "auto, uring, pread"),
        (["load", ck, "--pages", "2M"], "--pages", "4k, huge"),
        (["swap", ck, ck, "--verify", "maybe"], "--verify", "on, off, require"),
        (["read", ck, "--bogus"], "--bogus", ""),
        (["load", ck, "--heads", "2"], "--heads", "only with --tensor-parallel"),
        (["load", ck, "--tensor-parallel", "--shard", "*.mlp.*=split:x"], "--shard", "DIM 'x'"),
        (["load", ck, "--tensor-parallel", "--shard", "*.mlp.*"], "--shard", "PATTERN=SPEC"),
        (["load", ck, "--tensor-parallel", "--shard", "a=diagonal"], "--shard", "fused:DIM:PARTS"),
        (["read"], "PATH", ""),
        (["frobnicate"], "frobnicate", ""),
    ]
    for args, option, accepted in cases:
        code, out, err = run(*args)
        check(code == 2, f"eredu {' '.join(args)}: exit {code}, expected 2 (stderr: {err.strip()})")
        check(option in err and accepted in err,
              f"eredu {' '.join(args)}: the message does not name {option} and '{accepted}': {err.strip()}")
        check("stoi" not in err and "stoull" not in err and "stol" not in err, f"{args}: {err}")
    # --shards above the model's tensor count is caught before anything is written.
    code, _, err = run("gen", os.path.join(tmp, "many"), "--size", "1M", "--shards", "5000")
    check(code == 2 and "--shards" in err, f"gen --shards 5000: exit {code}: {err}")
    check(not os.path.exists(os.path.join(tmp, "many")), "gen --shards 5000 created its OUT")
    # `eredu gen -h` prints help, and writes nothing named -h.
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        code, out, _ = run("gen", "-h")
        check(code == 0 and "--shards" in out, f"gen -h: exit {code}")
        check(not os.path.exists(os.path.join(tmp, "-h")), "gen -h wrote a checkpoint named -h")
    finally:
        os.chdir(cwd)
    # Under --json a usage error is a JSON error object too.
    code, out, _ = run("read", ck, "--depth", "0", "--json")
    doc = json.loads(out.strip().splitlines()[-1])
    check(code == 2 and doc["error"]["kind"] == "usage" and "--depth" in doc["error"]["message"],
          f"read --depth 0 --json: exit {code}, {out}")


def case_help(tmp):
    """Every subcommand takes -h and --help; --version names the version and the commit."""
    code, out, _ = run("--help", expect=0)
    for c in COMMANDS:
        check(c in out, f"eredu --help does not list {c}")
    for c in COMMANDS:
        for flag in ("-h", "--help"):
            code, out, _ = run(c, flag)
            check(code == 0 and f"Usage: eredu {c}" in out, f"eredu {c} {flag}: exit {code}: {out[:200]!r}")
            check("--quiet" in out and "--verbose" in out, f"eredu {c} {flag} lacks -q/-v")
    code, out, _ = run("--version", expect=0)
    check(re.fullmatch(r"eredu \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,40}|unknown)\)\n", out) is not None,
          f"eredu --version printed {out!r}")
    code, _, err = run()
    check(code == 2 and "Usage" in err, f"eredu with no command: exit {code}")


def case_json(tmp):
    """Every --json document: one line, schema 1, the vocabulary, the same names everywhere."""
    ck = os.path.join(tmp, "ck")
    b = os.path.join(tmp, "b")
    gen(ck, "--shards", "2", "--checksums")
    gen(b, "--shards", "2", "--seed", "2", "--checksums")
    docs = {}
    for command, args in [("inspect", [ck]), ("read", [ck]), ("load", [ck, "--dtype", "f32", "--repeat", "2"]),
                          ("pipeline", [ck, "--passes", "2", "--threads", "1"]),
                          ("swap", [ck, b, "--swaps", "1", "--requests", "50", "--corrupt"]),
                          ("gen", [os.path.join(tmp, "g.safetensors"), "--size", "1M"])]:
        code, out, err = run(command, *args, "--json", expect=0)
        if code != 0:
            continue
        docs[command] = doc = document(out, command)
        check_vocabulary(doc, command)
    if len(docs) != 6:
        return
    check(isinstance(docs["inspect"]["tensors"], list), "inspect: tensors is not a list")
    for c in ("inspect", "read", "load", "swap", "gen"):
        check(isinstance(docs[c].get("tensor_count"), int), f"{c}: no tensor_count")
    for c in ("inspect", "read", "load", "swap"):
        check(docs[c].get("tensor_bytes") == docs["inspect"]["tensor_bytes"], f"{c}: tensor_bytes differs")
    for c in ("read", "load", "pipeline", "swap"):
        check(isinstance(docs[c].get("peak_rss_bytes"), int), f"{c}: no peak_rss_bytes")
    for c in ("read", "load", "pipeline"):
        check(isinstance(docs[c].get("staging_high_water_bytes"), int), f"{c}: no staging_high_water_bytes")
    # A load that converts counts the checkpoint's bytes, like its summary.
    load = docs["load"]
    check(load.get("pages") == "4k", f"load: pages {load.get('pages')!r}, expected the default 4k")
    code, out, _ = run("load", ck, "--pages", "huge", "--dtype", "f32", "--json", expect=0)
    if code == 0:
        huge = document(out, "load")
        check(huge["pages"] == "huge" and huge["output_bytes"] == load["output_bytes"],
              f"load --pages huge: pages {huge.get('pages')!r}, output_bytes {huge.get('output_bytes')}")
    check(load["bytes"] == load["tensor_bytes"] and load["output_bytes"] == 2 * load["tensor_bytes"],
          f"load --dtype f32: bytes {load['bytes']}, output_bytes {load['output_bytes']}")
    swap = docs["swap"]
    check(swap["ok"] and swap["failed_swap"]["rejected"] and swap["failed_swap"]["error_kind"] == "checksum_mismatch",
          f"swap --corrupt: {swap['failed_swap']}")
    check(all(w["verified"] for w in swap["swaps"]), "swap with sidecars: a swap verified nothing")


def case_errors(tmp):
    """A failure under --json is a JSON error object (kind, message, file, tensor, offset); exit 1."""
    missing = os.path.join(tmp, "missing.safetensors")
    for command in ("inspect", "read", "load", "pipeline"):
        code, out, err = run(command, missing, "--json")
        check(code == 1, f"{command} on a missing file: exit {code}")
        doc = document(out, command)
        e = doc.get("error", {})
        check(set(e) == {"kind", "message", "file", "parameter", "tensor", "offset", "os_error"},
              f"{command}: error fields {sorted(e)}")
        check(e.get("kind") not in (None, "failure", "usage"), f"{command}: error kind {e.get('kind')}")
        check(missing in err, f"{command}: stderr does not name the file: {err}")
    # A truncated file: the error names the file, and the kind is the format's.
    ck = os.path.join(tmp, "ck.safetensors")
    gen(ck)
    with open(ck, "r+b") as f:
        f.truncate(os.path.getsize(ck) - 100)
    code, out, _ = run("read", ck, "--json")
    e = json.loads(out.strip().splitlines()[-1])["error"]
    check(code == 1 and e["file"] == ck and e["kind"] == "incomplete_data", f"truncated read: {code} {e}")


def case_gen(tmp):
    """One rule for OUT: *.safetensors is a file, anything else a directory; no silent overwrite."""
    f = os.path.join(tmp, "one.safetensors")
    gen(f)
    check(os.path.isfile(f), "gen one.safetensors wrote no file")
    check(os.listdir(tmp) == ["one.safetensors"], f"gen left {os.listdir(tmp)}")
    code, _, err = run("gen", f, "--size", "1M", "-q")
    check(code == 1 and "--force" in err, f"gen over an existing file: exit {code}: {err}")
    gen(f, "--force", "--seed", "3")
    # No extension: a directory with model.safetensors.
    d = os.path.join(tmp, "plain")
    gen(d)
    check(sorted(os.listdir(d)) == ["model.safetensors"], f"gen plain: {os.listdir(d) if os.path.isdir(d) else d}")
    # Sharded: a directory; a second gen into it is refused; --force replaces it whole.
    s = os.path.join(tmp, "sharded")
    gen(s, "--shards", "3", "--checksums")
    before = sorted(os.listdir(s))
    check(len(before) == 5 and "model.safetensors.index.json" in before and "checksums.sha256.json" in before,
          f"gen --shards 3: {before}")
    code, _, err = run("gen", s, "--size", "1M", "-q")
    check(code == 1 and "--force" in err and sorted(os.listdir(s)) == before,
          f"gen into a sharded directory: exit {code}, files {os.listdir(s)}: {err}")
    gen(s, "--force")
    check(sorted(os.listdir(s)) == ["model.safetensors"], f"gen --force over shards left {os.listdir(s)}")
    code, out, _ = run("inspect", s, "--json", expect=0)
    check(document(out, "inspect")["file_count"] == 1, "the replaced directory does not open as one file")
    # A file name cannot take several shards.
    code, _, err = run("gen", os.path.join(tmp, "x.safetensors"), "--shards", "2", "-q")
    check(code == 2 and "--shards" in err, f"gen x.safetensors --shards 2: exit {code}: {err}")
    check(not os.path.exists(os.path.join(tmp, "x.safetensors")), "gen x.safetensors --shards 2 wrote something")


def case_swap_verify(tmp):
    """--verify on says when nothing was verified; --verify require fails without checksums."""
    a, b = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "b.safetensors")
    gen(a)
    gen(b, "--seed", "2")
    code, out, err = run("swap", a, b, "--swaps", "1", "--requests", "20", "--json", expect=0)
    doc = document(out, "swap") if code == 0 else {}
    check("verify nothing" in err, f"swap --verify on without checksums: no warning: {err}")
    check(doc.get("verified_nothing") is True and not doc["swaps"][0]["verified"], "swap: verified_nothing not set")
    code, out, err = run("swap", a, b, "--swaps", "1", "--requests", "20")
    check("nothing was verified" in out, f"swap text report does not say nothing was verified:\n{out}")
    code, out, err = run("swap", a, b, "--swaps", "1", "--requests", "20", "--verify", "require", "--json")
    check(code == 1, f"swap --verify require without checksums: exit {code}")
    e = json.loads(out.strip().splitlines()[-1]).get("error", {}) if out.strip() else {}
    check(e.get("kind") == "invalid_argument" and "--verify require" in e.get("message", ""),
          f"swap --verify require: {e}")
    gen(a, "--force", "--checksums")
    gen(b, "--force", "--seed", "2", "--checksums")
    code, out, _ = run("swap", a, b, "--swaps", "2", "--requests", "20", "--verify", "require", "--corrupt", "--json",
                       expect=0)
    if code == 0:
        doc = document(out, "swap")
        check(doc["ok"] and not doc["verified_nothing"] and doc["failed_swap"]["error_kind"] == "checksum_mismatch",
              f"swap --verify require --corrupt: {doc['failed_swap']}")


def case_load_verify(tmp):
    """load and pipeline --verify: on says when nothing was verified, require fails without digests and
    verifies every tensor with them, a wrong digest (--checksums FILE) fails with checksum_mismatch."""
    a = os.path.join(tmp, "a.safetensors")
    gen(a, "--layers", "2")
    code, out, err = run("load", a, "--verify", "on", "--json", expect=0)
    if code == 0:
        doc = document(out, "load")
        check(doc["verify"] == "on" and doc["loads"][0]["tensor_verified_count"] == 0,
              f"load --verify on without digests: {doc['loads']}")
        check("nothing is verified" in err, f"load --verify on without digests: no line says so: {err}")
    code, out, _ = run("load", a, "--verify", "on")
    check("nothing was verified" in out, f"load text report does not say nothing was verified:\n{out}")
    for command in ("load", "pipeline"):
        code, out, _ = run(command, a, "--verify", "require", "--json")
        e = json.loads(out.strip().splitlines()[-1]).get("error", {}) if out.strip() else {}
        check(code == 1 and e.get("kind") == "invalid_argument" and "--verify require" in e.get("message", ""),
              f"{command} --verify require without digests: exit {code}: {e}")
    gen(a, "--layers", "2", "--force", "--checksums")
    code, out, _ = run("load", a, "--verify", "require", "--repeat", "2", "--json", expect=0)
    if code == 0:
        doc = document(out, "load")
        for load in doc["loads"]:
            check(load["tensor_verified_count"] == doc["tensor_count"] and load["verified_bytes"] == doc["bytes"],
                  f"load --verify require: {load} of {doc['tensor_count']} tensors")
    code, out, _ = run("load", a, "--verify", "require", "--dtype", "f32", "--json", expect=0)
    if code == 0:
        doc = document(out, "load")
        check(doc["loads"][0]["tensor_verified_count"] == doc["tensor_count"], f"load --dtype f32 --verify: {doc}")
    code, out, _ = run("pipeline", a, "--verify", "require", "--passes", "2", "--compute", "none", "--json",
                       expect=0)
    if code == 0:
        doc = document(out, "pipeline")
        check(doc["tensor_verified_count"] == 2 * doc["layer_tensor_count"], f"pipeline --verify require: {doc}")
    sums = json.load(open(a + ".sha256.json"))
    victim = next(n for n in sorted(sums) if "layers." in n)  # one the pipeline reads too
    sums[victim] = ("0" if sums[victim][0] != "0" else "1") + sums[victim][1:]
    wrong = os.path.join(tmp, "wrong.json")
    with open(wrong, "w") as f:
        json.dump(sums, f)
    for command in ("load", "pipeline"):
        code, out, _ = run(command, a, "--verify", "on", "--checksums", wrong, "--json")
        e = json.loads(out.strip().splitlines()[-1]).get("error", {}) if out.strip() else {}
        check(code == 1 and e.get("kind") == "checksum_mismatch",
              f"{command} --checksums with a wrong digest: exit {code}: {e}")
    code, _, err = run("load", a, "--checksums", os.path.join(tmp, "missing.json"))
    check(code == 2 and "--checksums" in err, f"load --checksums missing.json: exit {code}: {err}")
    # XXH3-128 sidecars (gen --digest): every tensor verified with it, a changed byte caught.
    x = os.path.join(tmp, "x.safetensors")
    gen(x, "--layers", "2", "--checksums", "--digest", "xxh3-128")
    sums = json.load(open(x + ".sha256.json"))
    check(all(set(d) == {"xxh3-128"} for d in sums.values()), f"gen --digest xxh3-128 wrote {next(iter(sums.values()))}")
    code, out, _ = run("load", x, "--verify", "require", "--json", expect=0)
    if code == 0:
        doc = document(out, "load")
        check(doc["loads"][0]["tensor_verified_count"] == doc["tensor_count"], f"load of an xxh3 sidecar: {doc}")
    with open(x, "r+b") as f:
        header = int.from_bytes(f.read(8), "little")
        f.seek(8 + header + 100)
        byte = f.read(1)
        f.seek(8 + header + 100)
        f.write(bytes([byte[0] ^ 1]))
    code, out, err = run("load", x, "--verify", "require")
    check(code == 1 and "checksum_mismatch" in err and "xxh3-128" in err,
          f"load of a changed byte under an xxh3 sidecar: exit {code}: {err}")
    gen(x, "--layers", "2", "--force", "--checksums", "--digest", "both")
    check(all(set(d) == {"sha256", "xxh3-128"} for d in json.load(open(x + ".sha256.json")).values()),
          "gen --digest both did not write both digests")
    code, _, err = run("gen", os.path.join(tmp, "y.safetensors"), "--digest", "xxh3-128")
    check(code == 2 and "--digest" in err and "--checksums" in err, f"gen --digest without --checksums: {code}: {err}")


def case_weights(tmp):
    """--weights map|map-lock: the report counts the tensors mapped, a verified mapped load checks every
    one, map-lock reports RLIMIT_MEMLOCK, and a lock the limit refuses is a typed error naming it."""
    ck = os.path.join(tmp, "ck")
    gen(ck, "--checksums")
    code, out, err = run("load", ck, "--weights", "map", "--verify", "require", "--json", expect=0)
    if code == 0:
        doc = document(out, "load")
        check_vocabulary(doc, "load")
        check(doc["weights"] == "map" and doc["tensor_mapped_count"] == doc["tensor_count"]
              and doc["mapped_bytes"] == doc["tensor_bytes"] and doc["locked_bytes"] == 0,
              f"load --weights map: {doc}")
        check(doc["loads"][0]["tensor_verified_count"] == doc["tensor_count"], f"load --weights map --verify: {doc}")
        check(doc["storage_retained_bytes"] == 0, f"load --weights map: pool memory retained: {doc}")
    code, out, _ = run("load", ck, "--json", expect=0)
    if code == 0:
        doc = document(out, "load")
        check(doc["weights"] == "copy" and doc["tensor_mapped_count"] == 0, f"load (default): {doc}")
    code, out, _ = run("load", ck, "--weights", "map", expect=0)
    check(re.search(r"weights +\d+ of \d+ tensors .* mapped read-only", out) is not None,
          f"load --weights map: no weights line: {out}")
    code, out, _ = run("load", ck, "--weights", "map-lock", "--json", expect=0)
    if code == 0:
        doc = document(out, "load")
        check_vocabulary(doc, "load")
        check(doc["locked_bytes"] == doc["tensor_bytes"] and "memlock_exempt" in doc
              and ("memlock_limit" in doc or "memlock_limit_bytes" in doc), f"load --weights map-lock: {doc}")
    # A hot-swap between mapped versions: served from one version at a time, the corrupt copy rejected.
    b = os.path.join(tmp, "b")
    gen(b, "--checksums", "--seed", "2")
    code, out, _ = run("swap", ck, b, "--swaps", "2", "--requests", "50", "--corrupt", "--weights", "map", "--json",
                       expect=0)
    if code == 0:
        swap = document(out, "swap")
        check(swap["weights"] == "map" and swap["ok"] and swap["failed_swap"]["error_kind"] == "checksum_mismatch"
              and all(w["verified"] for w in swap["swaps"] if w["ok"]), f"swap --weights map --corrupt: {swap}")
    code, _, err = run("load", ck, "--weights", "mmap")
    check(code == 2 and "--weights" in err, f"load --weights mmap: exit {code}: {err}")

    # Beyond the limit: prlimit lowers it; as root, setpriv also drops CAP_IPC_LOCK, which exempts.
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    if not prlimit or (os.geteuid() == 0 and not setpriv):
        print("weights: prlimit/setpriv (util-linux) missing: the refused lock is not checked", file=sys.stderr)
        return
    prefix = [prlimit, "--memlock=65536"]
    if os.geteuid() == 0:
        prefix += [setpriv, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        print(f"weights: cannot lower the lock limit here ({probe.stderr.strip()}): the refused lock is not checked",
              file=sys.stderr)
        return
    p = subprocess.run([*prefix, EREDU, "load", ck, "--weights", "map-lock", "--json"], capture_output=True,
                       text=True, timeout=300)
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    e = json.loads(lines[-1]).get("error", {}) if lines else {}
    check(p.returncode == 1 and e.get("kind") == "out_of_memory" and "RLIMIT_MEMLOCK is 64 KiB" in e.get("message", "")
          and e.get("tensor"), f"load --weights map-lock under a 64 KiB limit: exit {p.returncode}: {e} {p.stderr}")


def case_progress(tmp):
    """Drawn only on a terminal, named by phase, cleared to the end of line, within the width."""
    ck = os.path.join(tmp, "ck.safetensors")
    gen(ck)
    _, _, err = run("read", ck)
    check("\r" not in err and "\x1b" not in err, f"progress drawn to a pipe: {err!r}")
    for args, phases in ((["read", ck], ["open", "read", "verify"]), (["load", ck, "--dtype", "f32"],
                                                                       ["open", "convert"]),
                         (["gen", os.path.join(tmp, "p.safetensors"), "--size", "2M", "--checksums"],
                          ["write", "hash"])):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
        p = subprocess.Popen([EREDU, *args], stdout=subprocess.DEVNULL, stderr=slave, close_fds=True)
        os.close(slave)
        data = b""
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        p.wait(timeout=60)
        os.close(master)
        text = data.decode("utf-8", "replace")
        check("\x1b[K" in text, f"{args[0]}: the progress line is not cleared to its end: {text!r}")
        for phase in phases:
            check(re.search(rf"(^|[\r ·]){phase}\b", text) is not None, f"{args[0]}: no '{phase}' phase in {text!r}")
        for line in text.replace("\n", "\r").split("\r"):
            if line.endswith("\x1b[K"):  # a drawn progress line: "\r<text>\x1b[K"
                shown = line[:-3]
                check(len(shown) < 40, f"{args[0]}: a progress line is wider than the 40-column terminal: {shown!r}")


def case_quiet(tmp):
    """-q drops informational lines (warnings stay); -v is accepted everywhere."""
    ck = os.path.join(tmp, "ck.safetensors")
    gen(ck)
    _, _, err = run("gen", os.path.join(tmp, "loud.safetensors"), "--size", "1M", expect=0)
    check("generating" in err, "gen without -q says nothing")
    _, _, err = run("gen", os.path.join(tmp, "quiet.safetensors"), "--size", "1M", "-q", expect=0)
    check(err == "", f"gen -q printed: {err!r}")
    # The library's informational lines (e.g. "O_DIRECT unavailable ..." on tmpfs) go with -q.
    _, _, loud = run("read", ck, expect=0)
    _, _, quiet = run("read", ck, "-q", expect=0)
    info = [l for l in loud.splitlines() if l.startswith("eredu: ")]
    check(not any(l in quiet for l in info), f"read -q still logged {quiet!r}")
    for c in ("inspect", "read", "load"):
        run(c, ck, "-v", expect=0)


def case_docs(tmp):
    """Every option each command's --help shows is in docs/cli.md's section of it, and back."""
    text = open(os.path.join(SOURCE, "docs", "cli.md"), encoding="utf-8").read()
    sections = re.split(r"^## ", text, flags=re.M)
    for c in COMMANDS:
        _, out, _ = run(c, "--help", expect=0)
        shown = set(re.findall(r"^\s+(?:-\w,)?(--[a-z][a-z0-9-]*)", out, flags=re.M))
        shown |= set(re.findall(r"^\s+(-\w),--", out, flags=re.M))
        section = next((s for s in sections if s.startswith(f"`eredu {c}")), None)
        if section is None:
            fail(f"docs/cli.md has no section '## `eredu {c} ...`'")
            continue
        documented = set(re.findall(r"^\|\s*`(--?[a-z][a-z0-9-]*)", section, flags=re.M))
        documented |= set(re.findall(r"^\|\s*`-\w`, `(--[a-z][a-z0-9-]*)", section, flags=re.M))
        documented |= set(re.findall(r"^\|\s*`(-\w)`, `--", section, flags=re.M))
        check(shown - documented == set(), f"docs/cli.md lacks options of eredu {c}: {sorted(shown - documented)}")
        check(documented - shown == set(),
              f"docs/cli.md documents options eredu {c} does not have: {sorted(documented - shown)}")
    # The README's command-line summary names only options that exist.
    readme = open(os.path.join(SOURCE, "README.md"), encoding="utf-8").read()
    block = re.search(r"## Command line\n\n```sh\n(.*?)```", readme, flags=re.S)
    check(block is not None, "README.md has no ```sh block under '## Command line'")
    if block:
        for line in block.group(1).splitlines():
            m = re.match(r"eredu (\w+)", line)
            if not m or m.group(1) not in COMMANDS:
                continue
            _, out, _ = run(m.group(1), "--help")
            for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line.split("#")[0]):
                check(opt in out, f"README.md shows {opt} for eredu {m.group(1)}, which has no such option")
    # Every field name the unitless list allows is documented.
    for name in UNITLESS:
        check(f"`{name}`" in text, f"docs/cli.md does not document the unitless field {name}")


def trace_events(path, command):
    """The complete events of a --trace file, after checking the file is trace-event JSON."""
    try:
        doc = json.load(open(path))
    except (OSError, ValueError) as e:
        fail(f"{command} --trace: {path} is not a JSON file: {e}")
        return [], {}
    events = doc.get("traceEvents")
    check(isinstance(events, list) and events, f"{command} --trace: no traceEvents list")
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    complete = [e for e in events if e.get("ph") == "X"]
    for e in complete:
        check(isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, f"{command} --trace: bad ts in {e}")
        check(isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, f"{command} --trace: bad dur in {e}")
        check(e.get("tid") in tracks, f"{command} --trace: event on a thread with no named track: {e}")
        check(e.get("pid") == 1 and isinstance(e.get("cat"), str), f"{command} --trace: bad pid or cat in {e}")
    return complete, tracks


def case_trace(tmp):
    """--trace FILE on load, read, pipeline and swap writes a trace-event timeline of the run."""
    ck = os.path.join(tmp, "ck.safetensors")
    gen(ck)
    runs = [
        ("load", [ck, "--copies", "reader"], {("read", "io"), ("bind", "engine")}),
        ("load", [ck, "--dtype", "f32"], {("bind", "engine")}),
        ("read", [ck, "--reader", "pread"], {("read", "io"), ("read tensor", "io")}),
        ("pipeline", [ck, "--passes", "1"], {("load unit", "pipeline"), ("stall", "pipeline"), ("bind", "engine")}),
        ("swap", [ck, ck, "--swaps", "1", "--requests", "10"],
         {("load", "swap"), ("publish", "swap"), ("bind", "engine")}),
    ]
    for command, args, expected in runs:
        path = os.path.join(tmp, f"{command}.trace.json")
        run(command, *args, "--trace", path, "-q", expect=0)
        events, tracks = trace_events(path, command)
        names = {(e["name"], e["cat"]) for e in events}
        check(expected <= names, f"{command} {' '.join(args[1:])} --trace: missing {expected - names} in {names}")
        check("main" in tracks.values(), f"{command} --trace: no 'main' track in {tracks}")
    # A conversion is traced as one: --dtype f32 of bf16 tensors converts every float tensor.
    events, _ = trace_events(os.path.join(tmp, "load.trace.json"), "load")
    check(any(e["name"].startswith("convert") for e in events), "load --dtype f32 --trace: no conversion event")
    # A path that cannot be written fails at once, naming it, before any work.
    bad = os.path.join(tmp, "no-such-dir", "t.json")
    code, out, err = run("read", ck, "--trace", bad)
    check(code == 1 and bad in err and "io_error" in err, f"read --trace {bad}: exit {code}, stderr {err!r}")


def case_completion(tmp):
    """--completion-bash prints a script bash accepts, offering every command."""
    code, out, _ = run("--completion-bash", expect=0)
    for c in COMMANDS:
        check(f"{c})" in out, f"the completion has no case for {c}")
    bash = shutil.which("bash")
    if bash:
        p = subprocess.run([bash, "-n"], input=out, text=True, capture_output=True)
        check(p.returncode == 0, f"bash -n rejects the completion: {p.stderr}")
        script = out + '\nCOMP_WORDS=(eredu read --reader ""); COMP_CWORD=3; _eredu; echo "${COMPREPLY[*]}"\n'
        p = subprocess.run([bash], input=script, text=True, capture_output=True)
        check(p.stdout.strip() == "auto uring pread", f"completing --reader offered {p.stdout.strip()!r}")


def case_gguf(tmp):
    """GGUF: gen --format gguf (one file, a split set), inspect's key metadata and every KV, load
    with the blocks kept and dequantized, swap between quantized versions (synthetic and ggml's
    Q4_K_M fixture), pipeline over blk.N units, typed errors."""
    m = os.path.join(tmp, "m.gguf")
    code, out, _ = run("gen", m, "--format", "gguf", "--dtype", "q4_k", "--size", "1M", "-q", "--json", expect=0)
    if code != 0:
        return
    g = document(out, "gen")
    check_vocabulary(g, "gen")
    check(g["format"] == "gguf" and os.listdir(tmp) == ["m.gguf"], f"gen m.gguf: {g}, {os.listdir(tmp)}")
    with open(m, "rb") as f:
        check(f.read(4) == b"GGUF", "gen --format gguf did not write the GGUF magic")
    # The text report: the key metadata and the tensors per type.
    _, out, _ = run("inspect", m, expect=0)
    check(re.search(rf"architecture llama, {g['layer_count']} blocks, file type 15 \(MOSTLY_Q4_K_M\)", out)
          is not None, f"inspect m.gguf: no key metadata line:\n{out[-600:]}")
    check(re.search(r"types:.* Q4_K x\d+", out) is not None and "blk.0.attn_q.weight" in out,
          f"inspect m.gguf: no Q4_K tensors:\n{out[-600:]}")
    # --json: every KV with its type and whole value; shapes row-major.
    _, out, _ = run("inspect", m, "--json", expect=0)
    doc = document(out, "inspect")
    check_vocabulary(doc, "inspect")
    f0 = doc["files"][0]
    check(f0["format"] == "gguf" and f0["gguf_version"] == 3 and f0["alignment_bytes"] == 32, f"files[0]: {f0}")
    kv = f0["metadata"]
    check(kv.get("general.architecture") == {"type": "STRING", "value": "llama"}, f"general.architecture: {kv}")
    check(kv.get("llama.block_count", {}).get("value") == g["layer_count"], f"llama.block_count: {kv}")
    check(f0["key_value_count"] == len(kv) and len(kv) >= 5, f"key_value_count {f0['key_value_count']}, {len(kv)}")
    check(doc["gguf"] == {"architecture": "llama", "block_count": g["layer_count"], "file_type": 15,
                          "file_type_name": "MOSTLY_Q4_K_M"}, f"gguf: {doc['gguf']}")
    tensors = {t["name"]: t for t in doc["tensors"]}
    quantized = [t for t in doc["tensors"] if t["dtype"] == "Q4_K"]
    check(len(quantized) > 0, "no Q4_K tensor")
    for t in quantized:
        check(len(t["shape"]) == 2 and t["shape"][1] % 256 == 0 and
              t["bytes"] == t["shape"][0] * t["shape"][1] // 256 * 144, f"{t['name']}: {t}")
    check(tensors.get("blk.0.attn_norm.weight", {}).get("dtype") == "F32", "norms are not F32")
    check(sum(d["tensor_count"] for d in doc["dtypes"]) == doc["tensor_count"], f"dtypes: {doc['dtypes']}")
    elements = 0
    for t in doc["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        elements += n
    # load: blocks kept byte for byte in size; dequantized to f32 / bf16.
    # Every spelling of a dtype Python's dtype= takes, the CLI takes too (one table: app::cast_choices).
    for dtype, per_element in (("keep", None), ("f32", 4), ("bf16", 2), ("fp32", 4), ("BFloat16", 2), ("half", 2)):
        code, out, _ = run("load", m, "--dtype", dtype, "--json", expect=0)
        if code != 0:
            continue
        load = document(out, "load")
        want = doc["tensor_bytes"] if per_element is None else elements * per_element
        check(load["bytes"] == doc["tensor_bytes"] and load["output_bytes"] == want,
              f"load --dtype {dtype}: output_bytes {load['output_bytes']}, expected {want}")
    run("read", m, "-q", expect=0)  # every byte through the lease pool equals pread's
    # swap between two quantized versions: requests dequantize their rows, each response
    # matches its own version, and the corrupt copy is not published.
    m2 = os.path.join(tmp, "m2.gguf")
    run("gen", m2, "--format", "gguf", "--dtype", "q4_k", "--size", "1M", "--seed", "2", "-q", expect=0)
    fixture = os.path.join(SOURCE, "..", "shared", "data", "gguf-quant",
                           "tiny-llama-q4_k_m.gguf")
    pairs = [(m, m2)] + ([(fixture, fixture)] if os.path.exists(fixture) else [])
    if len(pairs) == 1:
        print("note: no ../shared/data/gguf-quant: swap on ggml's Q4_K_M fixture not run")
    for a, b in pairs:
        code, out, _ = run("swap", a, b, "--swaps", "2", "--requests", "20", "--corrupt", "--json", expect=0)
        if code == 0:
            sd = document(out, "swap")
            f = sd["failed_swap"] or {}
            check(sd["ok"] and sd["mismatch_count"] == 0 and (a == m or sd["probe"]["dtype"] in ("Q4_K", "Q6_K")) and
                  f.get("rejected") is True and f.get("changed_count") == 0,
                  f"swap {os.path.basename(a)}: probe {sd['probe']}, failed swap {f}, {sd['mismatch_count']} mismatched")
    if os.path.exists(fixture):
        # pipeline over the fixture's blk.N layers, computing on its Q4_K/Q6_K weights.
        _, out, _ = run("inspect", fixture, "--json", expect=0)
        blocks = document(out, "inspect")["gguf"]["block_count"]
        code, out, _ = run("pipeline", fixture, "--json", expect=0)
        if code == 0:
            pd = document(out, "pipeline")
            check(pd["unit_count"] == blocks and pd["skipped_tensor_count"] == 3,
                  f"pipeline over the fixture: {pd['unit_count']} units of {blocks} blocks, "
                  f"{pd['skipped_tensor_count']} skipped")
    # A split set: any of its files opens all of it.
    d = os.path.join(tmp, "split")
    code, out, _ = run("gen", d, "--format", "gguf", "--dtype", "q8_0", "--size", "1M", "--shards", "3", "-q",
                       "--json", expect=0)
    if code == 0:
        gs = document(out, "gen")
        names = [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
        check(sorted(os.listdir(d)) == names, f"gen --shards 3 --format gguf: {os.listdir(d)}")
        for target in (d, os.path.join(d, names[1])):
            _, out, _ = run("inspect", target, "--json", expect=0)
            sd = document(out, "inspect")
            check(sd["file_count"] == 3 and sd["tensor_count"] == gs["tensor_count"],
                  f"inspect {target}: {sd['file_count']} files, {sd['tensor_count']} tensors")
            check(sd["files"][1]["metadata"]["split.no"]["value"] == 1, f"split.no of file 2: {sd['files'][1]}")
        code, out, _ = run("pipeline", d, "--compute", "none", "--threads", "1", "--json", expect=0)
        if code == 0:
            pd = document(out, "pipeline")
            check(pd["unit_count"] == gs["layer_count"] and pd["skipped_tensor_count"] == 3,
                  f"pipeline over blk.N: {pd['unit_count']} units, {pd['skipped_tensor_count']} skipped")
        gen(d, "--format", "gguf", "--force")
        check(sorted(os.listdir(d)) == ["model.gguf"], f"gen --force over a split set left {os.listdir(d)}")
    # Usage errors: a .gguf OUT or a quantized dtype without --format gguf.
    for args, option in ((["gen", os.path.join(tmp, "x.gguf"), "--size", "1M"], "--format"),
                         (["gen", os.path.join(tmp, "x"), "--dtype", "q4_k", "--size", "1M"], "--dtype")):
        code, _, err = run(*args)
        check(code == 2 and option in err, f"eredu {' '.join(args)}: exit {code}: {err}")
        check(not os.path.exists(args[1]), f"eredu {' '.join(args)} wrote something")
    # A GGUF file of version 1: a typed error naming the file.
    bad = os.path.join(tmp, "v1.gguf")
    with open(bad, "wb") as f:
        f.write(struct.pack("<4sIqq", b"GGUF", 1, 0, 0))
    code, out, _ = run("inspect", bad, "--json")
    e = json.loads(out.strip().splitlines()[-1]).get("error", {}) if out.strip() else {}
    check(code == 1 and e.get("kind") == "unsupported_version" and e.get("file") == bad, f"inspect v1.gguf: {e}")


def safetensors_tensors(path):
    """name -> (dtype, shape, absolute offset, bytes), from the file's own header (8-byte
    little-endian header length, the JSON header, data offsets relative to its end)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {name: (t["dtype"], t["shape"], 8 + n + t["data_offsets"][0], t["data_offsets"][1] - t["data_offsets"][0])
            for name, t in header.items() if name != "__metadata__"}


def parse_selection(text):
    """"[0:128, 64:128]" -> [(0, 128), (64, 128)]."""
    return [tuple(int(x) for x in r.split(":")) for r in text.strip("[]").split(",")]


def selection_bytes(data, shape, element, ranges):
    """The bytes of `ranges` of a row-major tensor `data`, in row-major order (as a load delivers them)."""
    strides = [element] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]

    def part(d, base):
        start, stop = ranges[d]
        if d == len(shape) - 1:
            return data[base + start * element:base + stop * element]
        return b"".join(part(d + 1, base + i * strides[d]) for i in range(start, stop))
    return part(0, 0)


MIXTRAL_LAYER = "model.layers.0.block_sparse_moe."
MIXTRAL_SHAPES = {MIXTRAL_LAYER + "gate.weight": [4, 64], MIXTRAL_LAYER + "experts.0.w1.weight": [128, 64],
                  MIXTRAL_LAYER + "experts.0.w2.weight": [64, 128], MIXTRAL_LAYER + "experts.1.w3.weight": [128, 64]}


def write_mixtral_layer(tmp):
    """A Mixtral-named F32 checkpoint of random bytes (a router and three expert projections, no
    attention): its path and the layer's name prefix."""
    path = os.path.join(tmp, "moe.safetensors")
    header, offset = {}, 0
    for name, shape in MIXTRAL_SHAPES.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + shape[0] * shape[1] * 4]}
        offset += shape[0] * shape[1] * 4
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + os.urandom(offset))
    return path, MIXTRAL_LAYER


def case_checksum(tmp):
    """eredu checksum --tensor-parallel 2: whole and shard digests equal to Python's of the file's
    bytes, a rerun writes the same sidecar, other kinds are kept, a changed byte fails with
    checksum_mismatch and leaves the sidecar as it was, rule options need --tensor-parallel."""
    ck = os.path.join(tmp, "ck.safetensors")
    sidecar = ck + ".sha256.json"
    run("gen", ck, "--size", "4M", "-q", expect=0)  # hidden 128: 2 heads of 64, so 2 ranks split attention too
    tensors = safetensors_tensors(ck)
    data = open(ck, "rb").read()
    element = {"BF16": 2, "F16": 2, "F32": 4}
    code, out, err = run("checksum", ck, "--tensor-parallel", "2", "--json", expect=0)
    if code != 0:
        return
    doc = document(out, "checksum")
    check_vocabulary(doc, "checksum")
    sums = json.load(open(sidecar))
    shards = sums.pop("__shards__", {})
    shard_total = sum(len(s) for s in shards.values())
    check(doc["path"] == ck and doc["sidecar"] == sidecar and doc["digest"] == "sha256", f"checksum: {doc}")
    check(doc["tensor_count"] == len(tensors) == doc["digest_count"] and doc["bytes"] == doc["tensor_bytes"]
          == sum(t[3] for t in tensors.values()) and doc["verified_count"] == 0 and doc["shard_verified_count"] == 0,
          f"checksum: counts {doc}")
    tp = doc["tensor_parallel"] or {}
    check(tp.get("rank_count") == 2 and tp.get("split_tensor_count") == len(shards) and tp.get("shard_count")
          == shard_total == doc["shard_count"] and tp.get("dims_from") == "eredu gen's dims", f"tensor_parallel: {tp}")
    # Every tensor's whole digest, and every shard's, is the SHA-256 of the file's bytes.
    check(set(sums) == set(tensors), f"the sidecar's tensors differ from the file's: {set(sums) ^ set(tensors)}")
    for name, (dtype, shape, offset, size) in tensors.items():
        check(sums.get(name) == hashlib.sha256(data[offset:offset + size]).hexdigest(), f"{name}: whole digest")
    downs = [n for n in tensors if n.endswith(".mlp.down_proj.weight")]
    check(len(downs) > 0 and all(n in shards for n in downs), f"no shards of the down projections: {sorted(shards)}")
    for name in downs:
        rows, cols = tensors[name][1]
        check(sorted(shards[name]) == [f"[0:{rows}, 0:{cols // 2}]", f"[0:{rows}, {cols // 2}:{cols}]"],
              f"{name} ({rows}x{cols}): shards {sorted(shards[name])}, not two halves of dim 1")
    check(not any(n.endswith("norm.weight") for n in shards), "a replicated norm has shard digests")
    for name, by_selection in shards.items():
        dtype, shape, offset, size = tensors[name]
        for text, digest in by_selection.items():
            want = hashlib.sha256(selection_bytes(data[offset:offset + size], shape, element[dtype],
                                                  parse_selection(text))).hexdigest()
            check(digest == want, f"{name} {text}: shard digest {digest}, Python's {want}")
    # A rerun checks every recorded digest and writes the same sidecar; without --tensor-parallel
    # the shards are kept.
    before = open(sidecar).read()
    code, out, _ = run("checksum", ck, "--tensor-parallel", "2", "--json", expect=0)
    if code == 0:
        again = document(out, "checksum")
        check(again["verified_count"] == len(tensors) and again["shard_verified_count"] == shard_total,
              f"rerun: verified {again['verified_count']}, {again['shard_verified_count']} shards")
    check(open(sidecar).read() == before, "a rerun on the unchanged checkpoint changed the sidecar")
    code, out, _ = run("checksum", ck, expect=0)
    check("sidecar" in out and "verified" in out and open(sidecar).read() == before,
          f"checksum without --tensor-parallel: {out} (sidecar changed: {open(sidecar).read() != before})")
    check(not os.path.exists(sidecar + ".tmp"), "a temporary sidecar was left behind")
    # 2 heads cannot be divided among 3 ranks: the sharding's error, nothing written.
    code, out, err = run("checksum", ck, "--tensor-parallel", "3", "--json")
    e = json.loads(out.strip().splitlines()[-1]).get("error", {}) if out.strip() else {}
    check(code == 1 and e.get("kind") == "invalid_argument" and "cannot be divided among 3 ranks" in err,
          f"checksum --tensor-parallel 3: exit {code}: {e}")
    # Another kind is added; the recorded SHA-256 digests are checked and kept.
    code, _, _ = run("checksum", ck, "--tensor-parallel", "2", "--digest", "xxh3-128", "-q", expect=0)
    both = json.load(open(sidecar))
    both_shards = both.pop("__shards__", {})
    check(all(set(d) == {"sha256", "xxh3-128"} and d["sha256"] == sums[n] for n, d in both.items())
          and all(set(d) == {"sha256", "xxh3-128"} and d["sha256"] == shards[n][t]
                  for n, s in both_shards.items() for t, d in s.items()),
          "checksum --digest xxh3-128 over a SHA-256 sidecar did not keep both")
    before = open(sidecar).read()
    # One byte changed inside a tensor: checksum_mismatch naming it, the sidecar untouched.
    victim = downs[0]
    with open(ck, "r+b") as f:
        f.seek(tensors[victim][2] + 10)
        byte = f.read(1)
        f.seek(tensors[victim][2] + 10)
        f.write(bytes([byte[0] ^ 1]))
    code, out, err = run("checksum", ck, "--tensor-parallel", "2", "--json")
    e = json.loads(out.strip().splitlines()[-1]).get("error", {}) if out.strip() else {}
    check(code == 1 and e.get("kind") == "checksum_mismatch" and e.get("tensor") == victim and e.get("file") == ck
          and e.get("offset") == tensors[victim][2] and victim in err,
          f"checksum of a changed byte: exit {code}: {e} {err[-500:]}")
    check(open(sidecar).read() == before and not os.path.exists(sidecar + ".tmp"),
          "a failed checksum changed the sidecar or left its temporary file")
    # The rule options need --tensor-parallel.
    for args in (["--heads", "3"], ["--shard", "*.mlp.*=replicated"], ["--family", "moe"]):
        code, _, err = run("checksum", ck, *args)
        check(code == 2 and args[0] in err and "only with --tensor-parallel" in err,
              f"checksum {' '.join(args)}: exit {code}: {err}")
    code, _, err = run("checksum", ck, "--tensor-parallel", "0")
    check(code == 2 and "1 to 4096" in err, f"checksum --tensor-parallel 0: exit {code}: {err}")
    code, _, err = run("checksum", ck, "--tensor-parallel", "2", "--family", "mixtral")
    check(code == 2 and "--family" in err and "llama, moe" in err, f"checksum --family mixtral: exit {code}: {err}")
    # --family moe (eredu::app's preset): a Mixtral-named checkpoint's experts are divided as a
    # dense MLP is (w1 and w3 by rows, w2 by columns), its router kept whole; under the default
    # llama rules the experts are replicated, so no shard is recorded.
    moe, layer = write_mixtral_layer(tmp)
    run("checksum", moe, "--tensor-parallel", "2", "-q", expect=0)
    check(not json.load(open(moe + ".sha256.json")).get("__shards__"), "--family llama divided a Mixtral expert")
    code, out, _ = run("checksum", moe, "--tensor-parallel", "2", "--family", "moe", "--json", expect=0)
    moe_shards = json.load(open(moe + ".sha256.json")).get("__shards__", {})
    rows = ["[0:64, 0:64]", "[64:128, 0:64]"]
    check({n: sorted(s) for n, s in moe_shards.items()}
          == {layer + "experts.0.w1.weight": rows, layer + "experts.1.w3.weight": rows,
              layer + "experts.0.w2.weight": ["[0:64, 0:64]", "[0:64, 64:128]"]},
          f"--family moe: shards {moe_shards}")
    moe_tensors, moe_data = safetensors_tensors(moe), open(moe, "rb").read()
    for name, by_selection in moe_shards.items():
        dtype, shape, offset, size = moe_tensors[name]
        for text, digest in by_selection.items():
            want = hashlib.sha256(selection_bytes(moe_data[offset:offset + size], shape, 4,
                                                  parse_selection(text))).hexdigest()
            check(digest == want, f"--family moe: {name} {text}: shard digest {digest}, Python's {want}")


def case_tensor_parallel(tmp):
    """`mpirun -np 2 eredu load --tensor-parallel` (argv after CASE: mpiexec, its flags and -np's
    flag): each rank reads split/N + replicated bytes exactly, the totals add up, --shard rules
    come first, and bad dimensions are the sharding's typed errors. Outside mpirun: one rank."""
    mpiexec = sys.argv[4:]

    def mpirun(np, *args):
        p = subprocess.run([*mpiexec, str(np), EREDU, *args], capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr

    ck = os.path.join(tmp, "ck.safetensors")
    run("gen", ck, "--size", "4M", "-q", expect=0)  # hidden 128: 2 heads of 64, 2 kv heads, so 2 ranks divide everything

    def check_document(doc, ranks, what):
        check_vocabulary(doc, what)
        tp = doc["tensor_parallel"]
        split, replicated = tp["split_bytes"], tp["replicated_bytes"]
        check(split + replicated == doc["tensor_bytes"], f"{what}: split {split} + replicated {replicated} "
              f"!= tensor_bytes {doc['tensor_bytes']}")
        check(tp["rank_count"] == ranks and len(tp["ranks"]) == ranks and tp["ok"], f"{what}: {tp}")
        check(split % ranks == 0, f"{what}: split bytes {split} do not divide by {ranks}")
        for r in tp["ranks"]:
            for load in r["loads"]:
                check(load["read_bytes"] == split // ranks + replicated == r["planned_read_bytes"],
                      f"{what}: rank {r['rank']} read {load['read_bytes']}, planned {r['planned_read_bytes']}, "
                      f"split/N + replicated {split // ranks + replicated}")
        total = sum(r["read_bytes"] for r in tp["ranks"])
        check(total == split + ranks * replicated == tp["read_bytes"] == doc["bytes"],
              f"{what}: ranks read {total} in all, document says {tp['read_bytes']} / {doc['bytes']}")
        check(tp["seconds"] == max(r["seconds"] for r in tp["ranks"]), f"{what}: seconds is not the slowest rank's")
        return tp

    code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--repeat", "2", "--json", "-q")
    check(code == 0, f"mpirun -np 2 eredu load --tensor-parallel: exit {code}: {err[-2000:]}")
    if code == 0:
        doc = document(out, "load")
        tp = check_document(doc, 2, "-np 2")
        check((tp["head_dim"], tp["heads"], tp["kv_heads"], tp["dims_from"]) == (64, 2, 2, "eredu gen's dims"),
              f"-np 2: dims {tp['head_dim']}, {tp['heads']}, {tp['kv_heads']} from {tp['dims_from']!r}")
        check(len(doc["loads"]) == 2 and doc["loads"][1]["recycled"], f"-np 2 --repeat 2: loads {doc['loads']}")
        # A --shard rule before the Llama rules: the MLP replicated, so more bytes per rank.
        code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--shard", "*.mlp.*_proj.weight=replicated",
                                "--json", "-q")
        check(code == 0, f"--shard: exit {code}: {err[-2000:]}")
        if code == 0:
            mlp = check_document(document(out, "load"), 2, "-np 2 --shard")
            check(mlp["replicated_bytes"] > tp["replicated_bytes"] and mlp["shard_rule_count"] == 1,
                  f"--shard '*.mlp.*_proj.weight=replicated' replicated {mlp['replicated_bytes']} bytes")
    # --replicated gather, the embedding replicated: each rank reads 1/2 of the replicated
    # tensors (their rows divide by 2) and receives the other half; the reader's bytes are still
    # exactly the plan's, and the replicated bytes are read once over the ranks, not twice.
    code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--replicated", "gather", "--shard",
                            "model.embed_tokens.weight=replicated", "--json", "-q")
    check(code == 0, f"--replicated gather: exit {code}: {err[-2000:]}")
    if code == 0:
        doc = document(out, "load")
        check_vocabulary(doc, "--replicated gather")
        g = doc["tensor_parallel"]
        split, replicated, gathered = g["split_bytes"], g["replicated_bytes"], g["gathered_bytes"]
        check(g["replicated_reads"] == "gather" and g["ok"] and g["whole_replicated_tensor_count"] == 0
              and g["gathered_tensor_count"] == g["replicated_tensor_count"] > 0 and gathered == replicated,
              f"--replicated gather: {g}")
        for r in g["ranks"]:
            check(r["read_bytes"] == r["planned_read_bytes"] == split // 2 + replicated // 2
                  and r["gathered_bytes"] == replicated // 2,
                  f"--replicated gather: rank {r['rank']} read {r['read_bytes']} (planned {r['planned_read_bytes']}), "
                  f"gathered {r['gathered_bytes']}; split/2 + replicated/2 = {split // 2 + replicated // 2}")
        check(sum(r["read_bytes"] for r in g["ranks"]) == split + replicated == doc["tensor_bytes"],
              f"--replicated gather: the ranks read {sum(r['read_bytes'] for r in g['ranks'])} in all")
        # The same rules, read on every rank: the replicated bytes twice, nothing gathered.
        code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--replicated", "read", "--shard",
                                "model.embed_tokens.weight=replicated", "--json", "-q")
        check(code == 0, f"--replicated read: exit {code}: {err[-2000:]}")
        if code == 0:
            rd = check_document(document(out, "load"), 2, "--replicated read")
            check(rd["replicated_reads"] == "read" and rd["gathered_bytes"] == 0
                  and rd["replicated_bytes"] == replicated and all(r["gathered_bytes"] == 0 for r in rd["ranks"]),
                  f"--replicated read: {rd}")
    code, _, err = mpirun(2, "load", ck, "--tensor-parallel", "--replicated", "gather", "--verify", "require", "-q")
    check(code == 2 and "--replicated gather" in err and "--verify require" in err,
          f"--replicated gather --verify require: exit {code}: {err[-500:]}")
    code, _, err = run("load", ck, "--replicated", "gather", "-q")
    check(code == 2 and "--replicated: only with --tensor-parallel" in err, f"--replicated alone: exit {code}: {err}")
    # The head size does not divide the query rows: the sharding's error names tensor and rule.
    code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--head-dim", "48", "--json", "-q")
    e = document(out, "load").get("error", {}) if out.strip() else {}
    check(code == 1 and e.get("kind") == "invalid_argument" and "q_proj" in (e.get("tensor") or "")
          and "granule=48" in e.get("message", "") and "q_proj" in err,
          f"--head-dim 48: exit {code}, error {e}, stderr {err[-500:]}")
    # 2 heads on 3 ranks cannot be divided.
    code, _, err = mpirun(3, "load", ck, "--tensor-parallel", "-q")
    check(code == 1 and "cannot be divided among 3 ranks" in err, f"-np 3: exit {code}: {err[-500:]}")
    # --heads that do not divide the query rows: a usage error (exit 2) naming the option.
    code, _, err = mpirun(2, "load", ck, "--tensor-parallel", "--heads", "3", "-q")
    check(code == 2 and "--heads" in err and "q_proj" in err, f"--heads 3: exit {code}: {err[-500:]}")
    # Verification: without shard digests require refuses before reading; with those of
    # `eredu checksum --tensor-parallel 2` every rank's pieces are checked; one byte changed in
    # rank 1's half of a row-parallel weight fails rank 1, named by the others.
    run("checksum", ck, "-q", expect=0)  # whole-tensor digests only
    code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--verify", "require", "-q")
    check(code == 1 and "no digest of that shard is recorded" in err and "eredu checksum" in err,
          f"--verify require without shard digests: exit {code}: {err[-800:]}")
    run("checksum", ck, "--tensor-parallel", "2", "-q", expect=0)
    code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--verify", "require", "--json", "-q")
    check(code == 0, f"--verify require with shard digests: exit {code}: {err[-2000:]}")
    if code == 0:
        doc = document(out, "load")
        check_document(doc, 2, "-np 2 --verify require")
        for r in doc["tensor_parallel"]["ranks"]:
            load = r["loads"][0]
            check(load["tensor_verified_count"] > 0 and load["tensor_unverified_count"] == 0
                  and load["verified_bytes"] == load["read_bytes"], f"--verify require: rank {r['rank']}: {load}")
        check(doc["checksum_count"] > doc["tensor_count"] and doc["loads"][0]["tensor_unverified_count"] == 0,
              f"--verify require: {doc['checksum_count']} digests, loads {doc['loads']}")
    # Fused tensors: verification reads each rank's pieces of them again, and a direct-read
    # window around a small piece reads its neighbours' bytes too. Those are reported apart, so
    # every rank's count is still exactly its plan's (it was not, before alignment_read).
    fused = ("--shard", "*.self_attn.q_proj.weight=fused:0:2")
    run("checksum", ck, "--tensor-parallel", "2", *fused, "-q", expect=0)
    code, out, err = mpirun(2, "load", ck, "--tensor-parallel", *fused, "--verify", "require", "--json", "-q")
    check(code == 0, f"--verify require, fused q_proj: exit {code}: {err[-2000:]}")
    if code == 0:
        fdoc = document(out, "load")
        check_vocabulary(fdoc, "-np 2 --verify require, fused q_proj")
        f = fdoc["tensor_parallel"]
        check(f["ok"] and f["rank_count"] == 2, f"--verify require, fused q_proj: {f}")
        for r in f["ranks"]:
            load = r["loads"][0]
            check(r["read_bytes"] == r["planned_read_bytes"] > load["verified_bytes"]
                  and r["alignment_read_bytes"] == load["alignment_read_bytes"] >= 0
                  and load["tensor_unverified_count"] == 0,
                  f"--verify require, fused q_proj: rank {r['rank']}: {r}")
    tensors = safetensors_tensors(ck)
    down = sorted(n for n in tensors if n.endswith(".mlp.down_proj.weight"))[0]
    dtype, shape, offset, size = tensors[down]
    with open(ck, "r+b") as f:  # row 0, its last element: in rank 1's columns
        f.seek(offset + size // shape[0] - 1)
        byte = f.read(1)
        f.seek(offset + size // shape[0] - 1)
        f.write(bytes([byte[0] ^ 0x10]))
    code, out, err = mpirun(2, "load", ck, "--tensor-parallel", "--verify", "on", "-q")
    check(code == 1 and "checksum_mismatch" in err and down in err and f"[0:{shape[0]}, {shape[1] // 2}:{shape[1]}]"
          in err and "rank 1 of 2 failed" in err, f"a changed byte in rank 1's shard: exit {code}: {err[-1500:]}")
    with open(ck, "r+b") as f:
        f.seek(offset + size // shape[0] - 1)
        f.write(byte)
    # --family moe: each rank reads half of every Mixtral expert projection and the whole router,
    # checked against the shard digests `eredu checksum --family moe` records.
    moe, layer = write_mixtral_layer(tmp)
    run("checksum", moe, "--tensor-parallel", "2", "--family", "moe", "-q", expect=0)
    code, out, err = mpirun(2, "load", moe, "--tensor-parallel", "--family", "moe", "--verify", "require", "--json",
                            "-q")
    check(code == 0, f"--family moe --verify require: exit {code}: {err[-2000:]}")
    if code == 0:
        mtp = check_document(document(out, "load"), 2, "-np 2 --family moe")
        check(mtp["replicated_bytes"] == 4 * 64 * 4 and mtp["split_bytes"] == 3 * 128 * 64 * 4,
              f"--family moe: split {mtp['split_bytes']}, replicated {mtp['replicated_bytes']}")
    # Outside mpirun: a group of one rank that reads the whole checkpoint.
    code, out, err = run("load", ck, "--tensor-parallel", "--json", "-q")
    check(code == 0, f"eredu load --tensor-parallel outside mpirun: exit {code}: {err[-2000:]}")
    if code == 0:
        one = check_document(document(out, "load"), 1, "one rank")
        check(one["read_bytes"] == document(out, "load")["tensor_bytes"], f"one rank read {one['read_bytes']}")


if __name__ == "__main__":
    tmp = tempfile.mkdtemp(prefix="eredu-cli-test-")
    try:
        globals()[f"case_{CASE}"](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failure(s) in case {CASE}", file=sys.stderr)
        sys.exit(1)
    print(f"case {CASE}: ok")
