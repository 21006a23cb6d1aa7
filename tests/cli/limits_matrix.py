#!/usr/bin/env python3
"""The limits matrix: every verb of `eredu` (inspect, read, load, pipeline, swap, gen,
checksum) under each per-process limit the system can impose, swept from a value at which
the command cannot start its work to one at which it succeeds:

  * RLIMIT_AS (prlimit --as): 32, 64, 128, 256, 512 MiB and 4 GiB — 6 values;
  * RLIMIT_NPROC (prlimit --nproc) as an unprivileged user (setpriv --reuid/--regid, one uid
    per concurrent cell, since the limit counts every thread of the user): 1, 2, 4, 6, 16 —
    5 values;
  * RLIMIT_NOFILE (prlimit --nofile): 4, 6, 12, 64 — 4 values (at 3, only stdin, stdout and
    stderr, the dynamic loader cannot open eredu's libraries: exit 127 before main, as for
    any dynamically linked program);
  * RLIMIT_MEMLOCK (prlimit --memlock, CAP_IPC_LOCK dropped): 0 and 64 KiB, load and swap
    with --weights map-lock — 2 values;

7 verbs x 17 = 119 cells on 8 MiB checkpoints; 10 cells of load (--verify on, --budget 16M)
and swap on 64 MiB checkpoints under RLIMIT_AS 96, 128, 160, 256 MiB and 1 GiB, where issue
30 met the aborts (a std::bad_alloc through a noexcept completion) and the swap that hung;
and 6 signal cells: swap, load and pipeline made to run long (--requests, --repeat,
--passes) under RLIMIT_AS 256 MiB and RLIMIT_NPROC 6, sent SIGTERM after 2 s. 135 cells.

Every cell must exit 0, or exit 1 with a typed error on stderr (`eredu VERB: ... [kind]`, a
kind of docs/errors.md): never die of a signal (SIGABRT from an exception that escaped a
noexcept boundary, SIGSEGV), never hang (a cell still running after 20 s fails; it is then
sent SIGTERM, and the failure says whether it exited within 1 s), never print
"terminate called". A signal cell must exit 143 within 1 s of its SIGTERM, with
"eredu VERB: " on stderr, or have ended before it as a plain cell must: a process spinning
in TBB (issue 30) ignored SIGTERM.

The checkpoints (`eredu gen --size 8M|64M --checksums`) are world-readable, so that the
unprivileged cells read them. The NPROC cells need root (to change user) and setpriv;
without them they are skipped with a message, as is everything without prlimit.
RLIMIT_AS cannot be used under AddressSanitizer (its shadow memory alone exceeds any of
these limits): ctest runs this only in builds without sanitizers.

    limits_matrix.py EREDU_BINARY [JOBS]

Prints the number of cells, one line per failing cell, and ends with "N passed, N failed".
About 7 s on the 2-core VM with the default 3 jobs when every cell passes (the checkpoints
included); a hung cell adds up to 30 s.
"""
import concurrent.futures
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

EREDU = os.path.abspath(sys.argv[1])
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VERBS = ["inspect", "read", "load", "pipeline", "swap", "gen", "checksum"]
MIB = 1 << 20
AS_VALUES = [32 * MIB, 64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB, 4096 * MIB]
NPROC_VALUES = [1, 2, 4, 6, 16]
NOFILE_VALUES = [4, 6, 12, 64]
MEMLOCK_VALUES = [0, 64 << 10]
BIG_AS_VALUES = [96 * MIB, 128 * MIB, 160 * MIB, 256 * MIB, 1024 * MIB]
HANG_S = 20.0
SIGNAL_AFTER_S = 2.0
EXIT_BOUND_S = 1.0
NOBODY = 65534  # the first of JOBS uids counting down: one per concurrent cell


def error_kinds():
    """The kinds docs/errors.md documents (the first column of its tables)."""
    with open(os.path.join(SOURCE, "docs", "errors.md"), encoding="utf-8") as f:
        kinds = set(re.findall(r"^\| `([a-z0-9_]+)` \|", f.read(), re.M))
    if "out_of_memory" not in kinds or "resource_exhausted" not in kinds:
        sys.exit(f"docs/errors.md lists no out_of_memory or resource_exhausted: {sorted(kinds)}")
    return kinds


KINDS = error_kinds()


def argv(verb, ck_a, ck_b, cell_dir, memlock=False, long_run=False):
    """The command line of `verb` on checkpoints ck_a (and ck_b); outputs go to cell_dir."""
    weights = ["--weights", "map-lock"] if memlock else []
    if verb == "inspect":
        return ["inspect", ck_a]
    if verb == "read":
        return ["read", ck_a, "--budget", "16M"]
    if verb == "load":
        return ["load", ck_a, "--verify", "on", "--budget", "16M", *weights] + (["--repeat", "1000"] if long_run else [])
    if verb == "pipeline":
        return ["pipeline", ck_a, "--verify", "on"] + (["--passes", "100000"] if long_run else [])
    if verb == "swap":
        return ["swap", ck_a, ck_b, "--requests", "1000000" if long_run else "20", *weights]
    if verb == "gen":
        return ["gen", os.path.join(cell_dir, "out"), "--size", "1M", "--checksums"]
    if verb == "checksum":
        return ["checksum", os.path.join(cell_dir, "model.safetensors")]
    raise ValueError(verb)


def cells():
    """(name, limit, verb, memlock, long_run, big) for every cell."""
    out = []
    for verb in VERBS:
        for n in AS_VALUES:
            out.append((f"{verb} as={n // MIB}M", ("as", n), verb, False, False, False))
        for n in NPROC_VALUES:
            out.append((f"{verb} nproc={n}", ("nproc", n), verb, False, False, False))
        for n in NOFILE_VALUES:
            out.append((f"{verb} nofile={n}", ("nofile", n), verb, False, False, False))
        for n in MEMLOCK_VALUES:
            out.append((f"{verb} memlock={n}", ("memlock", n), verb, verb in ("load", "swap"), False, False))
    for verb in ("load", "swap"):
        for n in BIG_AS_VALUES:
            out.append((f"{verb} 64M checkpoint as={n // MIB}M", ("as", n), verb, False, False, True))
    for verb in ("swap", "load", "pipeline"):
        out.append((f"{verb} as=256M SIGTERM", ("as", 256 * MIB), verb, False, True, False))
        out.append((f"{verb} nproc=6 SIGTERM", ("nproc", 6), verb, False, True, False))
    return out


def prefix(limit, uid, prlimit, setpriv):
    """The command prefix that applies `limit` (kind, value); None when it cannot be applied here."""
    kind, value = limit
    if kind == "nproc":
        if os.geteuid() != 0 or not setpriv:
            return None
        return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", prlimit, f"--nproc={value}"]
    p = [prlimit, f"--{kind}={value}"]
    if kind == "memlock" and os.geteuid() == 0:
        # As root, CAP_IPC_LOCK exempts from the limit: dropped, as cli_test.py's weights case does.
        p += [setpriv, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
    return p


def judge(verb, code, err, signalled, exit_after_signal):
    """None when the cell's outcome is allowed, else why not."""
    if "terminate called" in err:
        return f"exit {code}: 'terminate called' on stderr: an exception escaped: {tail(err)}"
    if code < 0 or code > 128 and code != 143:
        return f"killed by signal {abs(code) if code < 0 else code - 128} (exit {code}): {tail(err)}"
    if signalled:
        if code == 143:
            if exit_after_signal > EXIT_BOUND_S:
                return f"exit 143 {exit_after_signal:.2f} s after SIGTERM (bound {EXIT_BOUND_S} s)"
            if f"eredu {verb}: " not in err:
                return f"exit 143 without 'eredu {verb}: ' on stderr: {tail(err)}"
            return None
    elif code == 143:
        return f"exit 143 without a signal: {tail(err)}"
    if code == 0:
        return None
    if code != 1:
        return f"exit {code}: {tail(err)}"
    lines = [l for l in err.splitlines() if l.startswith(f"eredu {verb}: ")]
    typed = [l for l in lines if any(k in KINDS for k in re.findall(r"\[([a-z0-9_]+)\]", l))]
    if not typed:
        return f"exit 1 without a typed error ('eredu {verb}: ... [kind]', a kind of docs/errors.md): {tail(err)}"
    return None


def tail(text, n=600):
    text = text.strip().replace("\n", " | ")
    return text if len(text) <= n else "..." + text[-n:]


def run_cell(cell, root, checkpoints, uids, prlimit, setpriv):
    """Runs one cell; returns (name, failure or None, note)."""
    name, limit, verb, memlock, long_run, big = cell
    ck_a, ck_b = checkpoints["big" if big else "small"]
    uid = uids.get()
    try:
        cell_dir = tempfile.mkdtemp(dir=root)
        os.chmod(cell_dir, 0o777)
        if verb == "checksum":
            # The sidecar is written beside the checkpoint: a private link to A's data file.
            os.link(os.path.join(ck_a, "model.safetensors"), os.path.join(cell_dir, "model.safetensors"))
        pre = prefix(limit, uid, prlimit, setpriv)
        if pre is None:
            return name, None, "skipped"
        args = argv(verb, ck_a, ck_b, cell_dir, memlock, long_run)
        env = dict(os.environ, TMPDIR=cell_dir)
        start = time.monotonic()
        p = subprocess.Popen([*pre, EREDU, *args, "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=env, cwd=cell_dir)
        signalled, exit_after_signal, hung = False, 0.0, False
        wait_s = SIGNAL_AFTER_S if long_run else HANG_S
        try:
            _, err = p.communicate(timeout=wait_s)
        except subprocess.TimeoutExpired:
            signalled, hung = True, not long_run
            sent = time.monotonic()
            p.send_signal(signal.SIGTERM)
            try:
                _, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                return name, f"still running {HANG_S if hung else SIGNAL_AFTER_S:.0f} s in, and ignored SIGTERM " \
                             f"for 10 s (killed): {tail(err.decode(errors='replace'))}", ""
            exit_after_signal = time.monotonic() - sent
        err = err.decode(errors="replace")
        if hung:
            return name, f"hung: still running after {HANG_S:.0f} s; after SIGTERM, exit {p.returncode} in " \
                         f"{exit_after_signal:.2f} s: {tail(err)}", ""
        why = judge(verb, p.returncode, err, signalled, exit_after_signal)
        kind = re.findall(r"\[([a-z0-9_]+)\]", err)
        note = f"exit {p.returncode} in {time.monotonic() - start:.1f} s" + (f" [{kind[-1]}]" if kind else "")
        return name, why, note
    finally:
        uids.put(uid)


def main():
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    if not prlimit:
        print("limits matrix: prlimit (util-linux) is missing: nothing can be limited, nothing is checked")
        print("0 passed, 0 failed")
        return 0
    if os.geteuid() != 0 or not setpriv:
        print("limits matrix: the RLIMIT_NPROC cells need root and setpriv (to run as an unprivileged user, "
              "whom the limit binds): they are skipped")
    root = tempfile.mkdtemp(prefix="eredu-limits-")
    try:
        os.chmod(root, 0o755)
        checkpoints = {}
        for label, size in (("small", "8M"), ("big", "64M")):
            pair = []
            for seed in ("1", "2"):
                path = os.path.join(root, f"{label}-{seed}")
                subprocess.run([EREDU, "gen", path, "--size", size, "--checksums", "--seed", seed, "-q"], check=True,
                               timeout=120)
                for dirpath, _, files in os.walk(path):
                    os.chmod(dirpath, 0o755)
                    for f in files:
                        os.chmod(os.path.join(dirpath, f), 0o644)
                pair.append(path)
            checkpoints[label] = tuple(pair)
        all_cells = cells()
        print(f"limits matrix: {len(all_cells)} cells, {JOBS} at a time", flush=True)
        uids = queue.Queue()
        for i in range(JOBS):
            uids.put(NOBODY - i)
        passed = failed = skipped = 0
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=JOBS) as pool:
            futures = [pool.submit(run_cell, c, root, checkpoints, uids, prlimit, setpriv) for c in all_cells]
            for f in futures:
                name, why, note = f.result()
                if note == "skipped":
                    skipped += 1
                elif why:
                    failed += 1
                    print(f"FAIL {name}: {why}", flush=True)
                else:
                    passed += 1
                    if os.environ.get("EREDU_LIMITS_VERBOSE"):
                        print(f"ok   {name}: {note}", flush=True)
        print(f"limits matrix: {time.monotonic() - start:.0f} s" + (f", {skipped} cells skipped" if skipped else ""))
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
