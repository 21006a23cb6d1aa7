#!/usr/bin/env python3
"""The signal matrix: every verb of `eredu` × SIGINT, SIGTERM and SIGHUP, each delivered at a
seeded random moment of the run, 21 moments per verb (7 per signal, in text and --json
alternately): 7 verbs × 21 = 147 cells, and one run under nohup (a SIGHUP its parent
ignores stays ignored): 148 cells.

The moments are spread over the whole run: the run's length T is measured first (one run
without a signal), and moment k of 21 is drawn uniformly from [k, k+1) × 1.15 T / 21, so
the signals land while the command starts, opens the checkpoint, reads, converts, verifies,
publishes (swap), writes (gen, checksum) and shuts down, and some after it has exited.

Every cell must end in one of these ways, within 1 s of the signal (10 s before the
cell is declared hung):
  * exit 0 with its whole result (the signal came once the result was there, or after the
    exit): in --json, one valid document without "error";
  * exit 128 + the signal (130, 143, 129), "interrupted by SIG..." on stderr, and in --json
    one document whose error kind is "interrupted";
  * killed by the signal itself, only when it was sent before main() installed eredu's
    handler (the signal not yet among the process's caught ones, SigCgt in /proc/PID/status,
    read just before sending), when there is nothing yet to clean up.
And nothing is left behind: no file in the cell's TMPDIR (swap --corrupt's copy), no
"*.partial" or "*.tmp" file, gen's OUT either a whole checkpoint (exit 0) or gone, and
checksum's sidecar either the one before or a whole new one.

    signal_matrix.py EREDU_BINARY [SEED]

Prints one line per failing cell and ends with "N passed, N failed".
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

EREDU = os.path.abspath(sys.argv[1])
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 20261204
MOMENTS = 21
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
EXIT_BOUND_S = 1.0
HANG_S = 10.0


def default_signals():
    """In the child: the default action for the matrix's signals. A shell that runs the suite
    in the background ignores SIGINT, and eredu keeps what its parent ignores (nohup)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)


def eredu(*args, **kw):
    return subprocess.run([EREDU, *args], capture_output=True, timeout=300, **kw)


def setup(root):
    """Two compatible checkpoints with checksums (A sharded), small enough that a run takes
    a fraction of a second and large enough that its phases can be hit."""
    a, b = os.path.join(root, "A"), os.path.join(root, "B")
    for out, seed, shards in ((a, "1", "2"), (b, "2", "1")):
        p = eredu("gen", out, "--size", "48M", "--seed", seed, "--shards", shards, "--checksums", "-q")
        if p.returncode != 0:
            sys.exit(f"setup: eredu gen {out} failed: {p.stderr.decode(errors='replace')}")
    return a, b


def verbs(root, a, b):
    """name -> (argv builder for a cell directory, checker of what the cell leaves)."""
    def gen_args(cell):
        return ["gen", os.path.join(cell, "out"), "--size", "64M", "--shards", "2", "--checksums"]

    def checksum_args(cell):
        # Its own copy: the command rewrites the sidecar beside the checkpoint.
        c = os.path.join(cell, "C.safetensors")
        shutil.copyfile(os.path.join(b, "model.safetensors"), c)
        return ["checksum", c, "--digest", "both"]

    return {
        "inspect": lambda cell: ["inspect", a],
        "read": lambda cell: ["read", a, "--verify", "on"],
        "load": lambda cell: ["load", a, "--verify", "on", "--dtype", "f32"],
        "pipeline": lambda cell: ["pipeline", a, "--passes", "4", "--verify", "on"],
        "swap": lambda cell: ["swap", a, b, "--requests", "200", "--swaps", "2", "--corrupt"],
        "gen": gen_args,
        "checksum": checksum_args,
    }


def leftovers(cell, tmpdir, verb, rc):
    """What the cell left that it should not have (a list of reasons)."""
    found = []
    for d, _, files in os.walk(cell):
        for f in files:
            if ".partial" in f or f.endswith(".tmp"):
                found.append(f"temporary file {os.path.join(d, f)}")
    if os.listdir(tmpdir):
        found.append(f"TMPDIR holds {os.listdir(tmpdir)}")
    if verb == "gen":
        out = os.path.join(cell, "out")
        files = sorted(os.listdir(out)) if os.path.isdir(out) else []
        if rc == 0:
            want = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                    "model.safetensors.index.json", "checksums.sha256.json"}
            if set(files) != want:
                found.append(f"gen exited 0 but OUT holds {files}")
        elif os.path.exists(out):
            found.append(f"gen was interrupted but left OUT with {files}")
    if verb == "checksum":
        sidecar = os.path.join(cell, "C.safetensors.sha256.json")
        if os.path.exists(sidecar):
            try:
                with open(sidecar, "rb") as f:
                    json.loads(f.read().decode("utf-8"))
            except ValueError as e:
                found.append(f"a torn sidecar: {e}")
        elif rc == 0:
            found.append("checksum exited 0 without a sidecar")
    return found


def catches(pid, signo):
    """True when process `pid` has a handler installed for `signo` (SigCgt in its status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signo - 1) & 1)
    return False


def judge(verb, json_mode, signo, sent_after, rc, out, err, exit_after, handled):
    """Why this cell failed, or None. `handled`: eredu's handler was installed when it was sent."""
    name = signal.Signals(signo).name
    if exit_after is None:
        return f"no exit within {HANG_S} s of {name} (hung)"
    if exit_after > EXIT_BOUND_S:
        return f"exited {exit_after:.3f} s after {name}, more than {EXIT_BOUND_S} s"
    text = err.decode("utf-8", errors="replace")
    if rc == -signo:
        return f"killed by {name} {sent_after:.3f} s into the run, its handler installed" if handled else None
    if rc not in (0, 128 + signo):
        return f"exit {rc} after {name} (want 0 or {128 + signo}); stderr: {text[-600:]}"
    if rc == 128 + signo and f"interrupted by {name} while" not in text:
        return f"exit {rc} without 'interrupted by {name} while' on stderr: {text[-600:]}"
    if json_mode:
        lines = [l for l in out.split(b"\n") if l.strip()]
        if len(lines) != 1:
            return f"--json printed {len(lines)} lines, not one document"
        try:
            doc = json.loads(lines[0].decode("utf-8"))
        except ValueError as e:
            return f"--json printed an invalid document: {e}"
        kind = (doc.get("error") or {}).get("kind")
        if rc == 0 and kind is not None:
            return f"exit 0 with an error document ({kind})"
        if rc != 0 and kind != "interrupted":
            return f"exit {rc} with error kind {kind!r}, not 'interrupted'"
    return None


def nohup_cell(a):
    """`nohup`: a SIGHUP the parent ignores stays ignored, and the run ends normally. Returns
    why it failed, or None."""
    def ignore_hup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    p = subprocess.Popen([EREDU, "read", a, "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, preexec_fn=ignore_hup)
    time.sleep(0.05)
    p.send_signal(signal.SIGHUP)
    try:
        _, err = p.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return "hung"
    return None if p.returncode == 0 else f"exit {p.returncode} after an ignored SIGHUP: {err[-600:]!r}"


def main():
    rng = random.Random(SEED)
    root = tempfile.mkdtemp(prefix="eredu-signals-")
    passed = failed = 0
    try:
        a, b = setup(root)
        table = verbs(root, a, b)
        why = nohup_cell(a)
        if why:
            failed += 1
            print(f"FAIL read under nohup (SIGHUP ignored by the parent): {why}", flush=True)
        else:
            passed += 1
            print("ok   read under nohup (SIGHUP ignored by the parent): exit 0", flush=True)
        for verb, make_args in table.items():
            # The run's length without a signal (the longer of two).
            lengths = []
            for i in range(2):
                cell = os.path.join(root, f"{verb}-calibrate-{i}")
                os.makedirs(cell)
                t = time.monotonic()
                p = subprocess.run([EREDU, *make_args(cell)], capture_output=True, timeout=300)
                lengths.append(time.monotonic() - t)
                if p.returncode != 0:
                    sys.exit(f"{verb}: the run without a signal failed ({p.returncode}): "
                             f"{p.stderr.decode(errors='replace')[-2000:]}")
                shutil.rmtree(cell)
            length = max(lengths)
            for k in range(MOMENTS):
                signo = SIGNALS[k % 3]
                json_mode = (k // 3) % 2 == 1
                delay = (k + rng.random()) * 1.15 * length / MOMENTS
                cell = os.path.join(root, f"{verb}-{k}")
                tmpdir = os.path.join(cell, "tmp")
                os.makedirs(tmpdir)
                argv = make_args(cell) + (["--json"] if json_mode else [])
                env = dict(os.environ, TMPDIR=tmpdir)
                with open(os.path.join(cell, "stdout"), "w+b") as out, \
                        open(os.path.join(cell, "stderr"), "w+b") as err:
                    start = time.monotonic()
                    p = subprocess.Popen([EREDU, *argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                         preexec_fn=default_signals)
                    deadline = start + delay
                    while p.poll() is None and time.monotonic() < deadline:
                        time.sleep(min(0.002, max(0.0, deadline - time.monotonic())))
                    sent = None
                    handled = False
                    if p.poll() is None:
                        try:
                            handled = catches(p.pid, signo)
                        except OSError:  # it exited just now: the signal finds no process
                            pass
                        p.send_signal(signo)
                        sent = time.monotonic()
                    try:
                        p.wait(timeout=HANG_S)
                        ended = time.monotonic()
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                        ended = None
                    out.seek(0)
                    err.seek(0)
                    stdout, stderr = out.read(), err.read()
                rc = p.returncode
                if sent is None:
                    # It finished before the moment came: an ordinary run.
                    why = None if rc == 0 else f"exit {rc} without a signal: {stderr.decode(errors='replace')[-600:]}"
                    exit_after, sent_after = 0.0, delay
                else:
                    exit_after = None if ended is None else ended - sent
                    sent_after = sent - start
                    why = judge(verb, json_mode, signo, sent_after, rc, stdout, stderr, exit_after, handled)
                os.remove(os.path.join(cell, "stdout"))
                os.remove(os.path.join(cell, "stderr"))
                left = leftovers(cell, tmpdir, verb, rc)
                if left:
                    why = (why + "; " if why else "") + "; ".join(left)
                where = (f"{verb} {'--json ' if json_mode else ''}{signal.Signals(signo).name} at "
                         f"{delay:.3f} s of {length:.3f} s")
                if why:
                    failed += 1
                    print(f"FAIL {where}: {why}", flush=True)
                else:
                    passed += 1
                    outcome = "finished first" if sent is None else f"exit {rc} in {exit_after * 1000:.0f} ms"
                    print(f"ok   {where}: {outcome}", flush=True)
                shutil.rmtree(cell, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
