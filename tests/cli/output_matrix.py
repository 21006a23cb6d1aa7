#!/usr/bin/env python3
"""The output-stream matrix: every verb of `eredu`, in a run that succeeds and in one that fails
(a checkpoint that does not exist, an OUT that cannot be made), × stdout or stderr closed,
full (/dev/full) or a pipe nobody reads (EPIPE) × text and --json: 7 × 2 × 6 × 2 = 168 cells.

A command whose output cannot be written fails, and says so where it still can:
  * stdout broken, and the run writes to stdout (its report, its JSON document): exit 1 and
    "cannot write to standard output: <why>; the result was lost" on stderr;
  * stderr broken, and the run writes to stderr (log lines, gen's summary): exit 1 (there is
    nowhere left to say it);
  * a broken stream the run does not write to changes nothing: exit 0;
  * a run that fails exits 1 whatever its streams (its error report may be lost with them).
What a run writes to each stream is learnt from the same run with both streams working.
Never an abort or a death by signal (SIGPIPE is ignored: the write fails with EPIPE), never a
hang (60 s), and gen's output either whole or gone.

    output_matrix.py EREDU_BINARY

Prints one line per failing cell and ends with "N passed, N failed".
"""
import os
import shutil
import subprocess
import sys
import tempfile

EREDU = os.path.abspath(sys.argv[1])
HANG_S = 60


def setup(root):
    a, b = os.path.join(root, "A"), os.path.join(root, "B")
    for out, seed in ((a, "1"), (b, "2")):
        p = subprocess.run([EREDU, "gen", out, "--size", "8M", "--seed", seed, "--checksums", "-q"],
                           capture_output=True)
        if p.returncode != 0:
            sys.exit(f"setup: eredu gen {out} failed: {p.stderr.decode(errors='replace')}")
    return a, b


def commands(a, b):
    """verb -> (arguments of a run that succeeds, of one that fails), for a cell directory."""
    missing = "/nonexistent/eredu-output-matrix"
    return {
        "inspect": lambda cell: (["inspect", a], ["inspect", missing]),
        "read": lambda cell: (["read", a], ["read", missing]),
        "load": lambda cell: (["load", a, "--verify", "on"], ["load", missing]),
        "pipeline": lambda cell: (["pipeline", a, "--passes", "2"], ["pipeline", missing]),
        "swap": lambda cell: (["swap", a, b, "--requests", "20"], ["swap", a, missing]),
        "gen": lambda cell: (["gen", os.path.join(cell, "out"), "--size", "1M"],
                             ["gen", "/dev/null/out", "--size", "1M"]),
        "checksum": lambda cell: (["checksum", os.path.join(cell, "C.safetensors")], ["checksum", missing]),
    }


def prepare(verb, cell, b):
    os.makedirs(cell)
    if verb == "checksum":
        shutil.copyfile(os.path.join(b, "model.safetensors"), os.path.join(cell, "C.safetensors"))


def run(argv, stream, how):
    """Runs eredu with `stream` (1 or 2) broken `how`; the other stream captured. Returns
    (rc, captured bytes of the other stream) or (None, ...) when it hung."""
    other = 2 if stream == 1 else 1
    read_end = None
    kwargs = {}
    if how == "closed":
        kwargs["preexec_fn"] = lambda: os.close(stream)
        target = subprocess.DEVNULL
    elif how == "full":
        target = open("/dev/full", "wb")
    else:  # a pipe whose reader is gone before anything is written
        read_end, write_end = os.pipe()
        os.close(read_end)
        target = write_end
    streams = {"stdout": target, "stderr": subprocess.PIPE} if stream == 1 else \
        {"stdout": subprocess.PIPE, "stderr": target}
    try:
        p = subprocess.run([EREDU, *argv], stdin=subprocess.DEVNULL, timeout=HANG_S, **streams, **kwargs)
        return p.returncode, (p.stderr if other == 2 else p.stdout)
    except subprocess.TimeoutExpired:
        return None, b""
    finally:
        if how == "full":
            target.close()
        elif how == "pipe":
            os.close(target)


def cell_result(root, b, verb, make, failing, json_mode, writes, stream, how, passed, failed):
    """Runs one cell; returns the counts with it added."""
    cell = os.path.join(root, f"{verb}-{failing}-{json_mode}-{stream}-{how}")
    prepare(verb, cell, b)
    argv = make(cell)[failing] + (["--json"] if json_mode else [])
    rc, other = run(argv, stream, how)
    text = other.decode("utf-8", errors="replace")
    where = (f"{verb}{' (failing)' if failing else ''}{' --json' if json_mode else ''} with "
             f"{'stdout' if stream == 1 else 'stderr'} {how}")
    want = 1 if failing or writes[stream] else 0
    why = None
    if rc is None:
        why = f"no exit within {HANG_S} s (hung)"
    elif rc < 0 or rc >= 128:
        why = f"ended by a signal or an abort (exit {rc})"
    elif rc != want:
        why = f"exit {rc}, want {want} (the run writes {'something' if writes[stream] else 'nothing'} there)"
    elif stream == 1 and writes[1] and "cannot write to standard output" not in text:
        why = f"exit 1 without saying that stdout failed: {text[-600:]}"
    if verb == "gen" and not failing:
        out = os.path.join(cell, "out")
        if rc == 0 and not os.path.exists(os.path.join(out, "model.safetensors")):
            why = (why or "") + " gen exited 0 without its checkpoint"
        leftover = [f for f in (os.listdir(out) if os.path.isdir(out) else []) if ".partial" in f]
        if leftover:
            why = (why or "") + f" gen left {leftover}"
    if why:
        failed += 1
        print(f"FAIL {where}: {why}", flush=True)
    else:
        passed += 1
        print(f"ok   {where}: exit {rc}", flush=True)
    shutil.rmtree(cell, ignore_errors=True)
    return passed, failed


def main():
    root = tempfile.mkdtemp(prefix="eredu-output-")
    passed = failed = 0
    try:
        a, b = setup(root)
        for verb, make in commands(a, b).items():
            for failing in (False, True):
                for json_mode in (False, True):
                    # What this run writes where, with both streams working.
                    cell = os.path.join(root, f"{verb}-reference")
                    prepare(verb, cell, b)
                    argv = make(cell)[failing] + (["--json"] if json_mode else [])
                    ref = subprocess.run([EREDU, *argv], capture_output=True, timeout=300)
                    if ref.returncode != (1 if failing else 0):
                        sys.exit(f"{verb}: the reference run exited {ref.returncode}: {ref.stderr[-2000:]!r}")
                    writes = {1: bool(ref.stdout), 2: bool(ref.stderr)}
                    shutil.rmtree(cell)
                    for stream in (1, 2):
                        for how in ("closed", "full", "pipe"):
                            passed, failed = cell_result(root, b, verb, make, failing, json_mode, writes, stream, how,
                                                         passed, failed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
