#!/usr/bin/env python3
"""The fault matrix as a user meets it: the `eredu` command on faultfs.

    cli_fault_matrix.py ERDU_BINARY FAULTFS_BINARY

test_fault_matrix.cpp proves the library's entry points; this proves the command's: `read`,
`load`, `pipeline` and `swap` on a checkpoint served by faultfs with EIO at the header, in the
middle of the largest tensor and at the last byte, short replies of 1, 7 and 4096 bytes, and a
file that shrinks mid-load; × readers (uring, pread, where the command has the option) ×
the mount's direct_io (off, on). Every cell: exit status 0 with every tensor verified against
its SHA-256, or exit status 1 with a typed error (`[io_error]`, `[unexpected_eof]`,
`[file_changed]`) naming the file (and the tensor, for a fault inside one) — never exit 0 with
an error injected that a read must meet, never a crash, never a hang. Then SIGINT and SIGTERM
during slow reads: the conventional status (130, 143) within 2 s, a message saying what was
interrupted, and no temporary files left by `swap --corrupt`.

Prints "skipped: ..." (ctest's skip expression) where FUSE cannot be used.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

EREDU, FAULTFS = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TIMEOUT = 120  # seconds a cell may take before it counts as a hang
failures = []


def fail(message):
    failures.append(message)
    print("FAIL:", message, file=sys.stderr)


def run(args, timeout=TIMEOUT):
    try:
        p = subprocess.run([EREDU, *args], capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return None, "", f"no exit within {timeout} s"


class Mount:
    """faultfs serving SRC at MNT; stopped (and unmounted) on exit."""

    def __init__(self, root):
        self.src, self.mnt = os.path.join(root, "src"), os.path.join(root, "mnt")
        os.makedirs(self.src)
        os.makedirs(self.mnt)
        args = [FAULTFS, self.src, self.mnt, "-f", "-o", "max_threads=8"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(500):
            if os.path.ismount(self.mnt):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"faultfs exited before mounting: {self.proc.stderr.read().decode()[-300:]}")
            time.sleep(0.01)
        raise RuntimeError("faultfs did not mount within 5 s")

    def rules(self, rel, lines):
        path = os.path.join(self.src, rel, ".faultfs")
        with open(path + ".new", "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.rename(path + ".new", path)  # one step: the daemon never reads half a file

    def close(self):
        self.proc.terminate()  # libfuse unmounts on SIGTERM
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)


def layout(path):
    """(file size, [(tensor, offset, bytes)]) of a one-file checkpoint directory."""
    rc, out, err = run(["inspect", "--json", path])
    if rc != 0:
        raise RuntimeError(f"inspect {path}: {err}")
    doc = json.loads(out)
    return doc["files"][0]["size_bytes"], [(t["name"], t["offset"], t["bytes"]) for t in doc["tensors"]]


def faults(size, tensors):
    """name -> (faultfs rule, expected: None for success or (error kinds, tensor named or None))."""
    # The largest tensor of a decoder layer: `pipeline` reads only those.
    name, offset, nbytes = max((t for t in tensors if ".layers." in t[0]), key=lambda t: t[2])
    mid = offset + nbytes // 2
    # Replies of 1 and 7 bytes only for requests that start before the end of that tensor (the
    # header and the first tensors): over the whole file they cost a FUSE round trip per byte.
    tiny = offset + nbytes
    last = tensors[-1][0]
    eio = ("[io_error]",)
    return {
        "none": (None, None),
        "eio header": ("model.safetensors errno EIO 0 8", (eio, None)),
        "eio mid tensor": (f"model.safetensors errno EIO {mid} {mid + 4096}", (eio, name)),
        # lm_head, which `pipeline` skips: there it may succeed (or meet the fault by readahead).
        "eio last byte": (f"model.safetensors errno EIO {size - 1} {size}", (eio, last)),
        # Out of direct_io mode the kernel takes a short reply for the end of the file: a
        # typed unexpected_eof is right there; a success must have verified every tensor.
        "short 1": (f"model.safetensors short 1 0 {tiny}", SHORT),
        "short 7": (f"model.safetensors short 7 0 {tiny}", SHORT),
        "short 4096": ("model.safetensors short 4096", SHORT),
        "shrink": (f"model.safetensors shrink {size // 2} {size // 3}", (("[unexpected_eof]", "[file_changed]", "[io_error]"), None)),
    }


# Expected outcome of a cell: None (a verified success), or (error kinds, tensor the message
# names or None), or SHORT (either a verified success or a typed unexpected_eof).
SHORT = "success or unexpected_eof"
# A fault in bytes the command does not read: a verified success, or the typed error of a
# readahead that met it.
OUTSIDE = "success or io_error"


def check_cell(where, rc, out, err, expected):
    if rc is None:
        fail(f"{where}: hung ({err})")
        return
    if rc < 0 or rc > 2:
        fail(f"{where}: exit {rc} (a crash?)\n{err[-1500:]}")
        return
    if expected == SHORT:
        # checksum_mismatch: the page-cache guard's residual window (docs/reliability.md),
        # closed by the digests every cell verifies against.
        expected = None if rc == 0 else (("[unexpected_eof]", "[checksum_mismatch]"), None)
    elif expected == OUTSIDE:
        expected = None if rc == 0 else (("[io_error]",), None)
    if expected is None:
        if rc != 0:
            fail(f"{where}: exit {rc}, expected a verified success\n{err[-1500:]}")
        return
    kinds, tensor = expected
    err = err + out  # a rejected swap is reported in the swap's report on stdout
    if rc == 0:
        fail(f"{where}: exit 0 with a fault a read must meet: wrong bytes were accepted\n{out[-800:]}")
        return
    if rc != 1:
        fail(f"{where}: exit {rc}, expected 1\n{err[-1500:]}")
        return
    if not any(k in err for k in kinds):
        fail(f"{where}: the error is none of {kinds}\n{err[-1500:]}")
    if "model.safetensors" not in err:
        fail(f"{where}: the error does not name the file\n{err[-1500:]}")
    if tensor is not None and tensor not in err:
        fail(f"{where}: the error does not name tensor {tensor}\n{err[-1500:]}")
    if "DIFFER" in out + err:
        fail(f"{where}: reported as a difference, not as the I/O error\n{err[-1500:]}")


def matrix(mount, direct_io):
    a = os.path.join(mount.src, "a")  # swap's A, served without faults
    subprocess.run([EREDU, "gen", a, "--size", "1M", "--seed", "1", "--checksums", "-q"], check=True)
    b = os.path.join(mount.src, "b")
    subprocess.run([EREDU, "gen", b, "--size", "1M", "--seed", "2", "--checksums", "-q"], check=True)
    size, tensors = layout(b)
    ck, ca = os.path.join(mount.mnt, "b"), os.path.join(mount.mnt, "a")
    cells = 0
    for fault, (rule, expected) in faults(size, tensors).items():
        runs = []
        # auto is uring or pread by the same policy: the two it can choose cover it.
        for reader in ("uring", "pread"):
            runs.append((f"read --reader {reader}", ["read", ck, "--reader", reader, "--verify", "on", "-q"]))
            runs.append((f"load --reader {reader}", ["load", ck, "--reader", reader, "--verify", "require", "-q"]))
        runs.append(("pipeline", ["pipeline", ck, "--verify", "require", "-q"]))
        runs.append(("swap", ["swap", ca, ck, "--swaps", "2", "--requests", "50", "--verify", "require", "-q"]))
        for what, args in runs:
            want = expected
            if what == "pipeline" and fault == "eio last byte":
                want = OUTSIDE
            # Rewritten before each run: that also resets the byte count of shrink.
            mount.rules("b", [f"model.safetensors direct_io {'on' if direct_io else 'off'}"] + ([rule] if rule else []))
            rc, out, err = run(args)
            check_cell(f"direct_io {'on' if direct_io else 'off'}, {fault}, {what}", rc, out, err, want)
            cells += 1
    mount.rules("b", [])
    return cells


def signals(mount):
    """SIGINT and SIGTERM while reads are slow: the conventional status, a message, no litter."""
    mount.rules("b", ["* delay 200"])
    ck, ca = os.path.join(mount.mnt, "b"), os.path.join(mount.mnt, "a")
    for sig, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        for what, args in (("load", ["load", ck]), ("read", ["read", ck]),
                           ("swap --corrupt", ["swap", ca, ck, "--corrupt", "--swaps", "2"])):
            before = set(glob.glob(os.path.join(tempfile.gettempdir(), "eredu-swap-*")))
            p = subprocess.Popen([EREDU, *args, "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(1.0)
            sent = time.monotonic()
            p.send_signal(sig)
            try:
                _, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                fail(f"{what}, {sig.name}: no exit within 10 s")
                continue
            took = time.monotonic() - sent
            where = f"{what}, {sig.name}"
            if p.returncode == 0:
                continue  # it finished before the signal came: nothing to check
            if p.returncode != status:
                fail(f"{where}: exit {p.returncode}, expected {status}\n{err[-800:]}")
            if took > 2.0:
                fail(f"{where}: exit took {took:.2f} s after the signal")
            if "interrupted" not in err:
                fail(f"{where}: no message says what was interrupted\n{err[-800:]}")
            left = set(glob.glob(os.path.join(tempfile.gettempdir(), "eredu-swap-*"))) - before
            if left:
                fail(f"{where}: left {sorted(left)} behind")
    mount.rules("b", [])


def main():
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        print(f"skipped: cannot open /dev/fuse ({e.strerror}): no FUSE here")
        return 0
    cells = 0
    for direct_io in (False, True):
        with tempfile.TemporaryDirectory(prefix="eredu-cli-faults-") as root:
            try:
                mount = Mount(root)
            except RuntimeError as e:
                print(f"skipped: {e}")
                return 0
            try:
                cells += matrix(mount, direct_io)
                if not direct_io:
                    signals(mount)
            finally:
                mount.close()
    print(f"cli fault matrix: {cells} cells, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
