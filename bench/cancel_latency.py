#!/usr/bin/env python3
"""Cancellation latency: the time from a signal to the process's exit for `eredu load`,
`read`, `pipeline` and `swap`, on a large checkpoint and on one of many tiny tensors (the
issue's 100 000 one-byte tensors), against two floors signalled the same way in the same
rounds: `sleep`, which dies on the signal at once (the measurement's own cost), and a process
holding as many touched pages as the large checkpoint has bytes (`hold big`): the kernel frees
a process's memory before its parent learns it exited, so no load that holds its tensors can
exit faster than that.

Each round runs every case once, in an order rotated (and shuffled, seeded) per round; each
run is signalled (SIGINT) at a uniformly drawn moment of the case's own run length (measured
before the rounds), so the moments cover opening, reading, converting and verifying alike.
A run that ended before its moment is counted apart and not in the latencies.

With --python (the directory holding the built `eredu` package, build/release/python), the
same rounds also time Python loads of the large checkpoint in a child interpreter, where the
process need not exit: a blocking `eredu.load_file` and `safe_open(...).load()` interrupted by
SIGINT, from the parent's send to the KeyboardInterrupt caught in the child (both read
CLOCK_MONOTONIC, one clock for every process), and an `eredu.aload` task cancelled with
`task.cancel()` at a drawn moment, from the call to the CancelledError, measured in the child;
both also with the freed storage kept for reuse (`eredu.set_storage_retention`, cases "kept"),
which shows what freeing the partial unit costs the exception when it is not on its path.

Prints per case the median, p99 and min-max of the latency over the rounds, and the p99's
excess over sleep's; writes one JSON line per run.

usage: bench/cancel_latency.py EREDU [--big PATH] [--tiny PATH] [--rounds 20] [--out FILE]
                               [--python DIR]
  --big     a large checkpoint (default: eredu gen of 2 GiB in a temporary directory)
  --tiny    a checkpoint of many tiny tensors (default: 100 000 one-byte U8 tensors, written)
  --python  add the Python cases, importing eredu from DIR with this script's interpreter
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time


def write_tiny(path, count):
    """A safetensors file of `count` one-byte U8 tensors (the pipeline's layer naming)."""
    header, data = {}, bytearray()
    for i in range(count):
        header[f"model.layers.{i // 100}.t{i % 100}"] = {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
        data.append(i & 0xFF)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(data))


def default_signals():
    """In the child: SIGINT's default action (a background job of a shell ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# The floor a process holding memory cannot beat: the kernel frees its pages before its
# parent learns that it exited. Holds N bytes of touched 4 KiB pages, then sleeps.
HOLD = ("import mmap,sys,time\nn=int(sys.argv[1])\nm=mmap.mmap(-1,n)\n"
        "for o in range(0,n,4096): m[o]=1\ntime.sleep(1000)\n")


# The Python cases' child. `blocking MODE PATH`: prints "start T", loads (MODE load_file or
# safe_open), and prints "interrupted T" from its KeyboardInterrupt handler, or "ended T".
# `aload PATH DELAY`: starts an aload task, cancels it DELAY s later, prints "latency S" from
# cancel() to the CancelledError, or "ended T" when the load ended first (DELAY < 0: never
# cancelled). T: time.monotonic().
PY_CHILD = r"""
import asyncio, os, sys, time
import eredu
if os.environ.get("EREDU_BENCH_RETAIN"):
    eredu.set_storage_retention(int(os.environ["EREDU_BENCH_RETAIN"]))
def say(*a): print(*a, flush=True)
if sys.argv[1] == "blocking":
    mode, path = sys.argv[2], sys.argv[3]
    say("start", time.monotonic())
    try:
        if mode == "load_file":
            eredu.load_file(path)
        else:
            with eredu.safe_open(path, framework="np") as f:
                f.load()
        say("ended", time.monotonic())
    except KeyboardInterrupt:
        say("interrupted", time.monotonic())
else:
    path, delay = sys.argv[2], float(sys.argv[3])
    async def main():
        t0 = time.monotonic()
        task = asyncio.create_task(eredu.aload(path))
        if delay >= 0:
            await asyncio.sleep(delay)
        if delay < 0 or task.done():
            await task
            say("ended", time.monotonic(), time.monotonic() - t0)
            return
        t = time.monotonic()
        task.cancel()
        try:
            await task
            say("ended", time.monotonic(), time.monotonic() - t0)
        except asyncio.CancelledError:
            say("latency", time.monotonic() - t)
    asyncio.run(main())
"""


def python_child(python_dir, args, retain=0):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [python_dir, os.environ.get("PYTHONPATH")])))
    if retain:
        env["EREDU_BENCH_RETAIN"] = str(retain)
    return subprocess.Popen([sys.executable, "-c", PY_CHILD] + args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, env=env, text=True, preexec_fn=default_signals)


def python_blocking(python_dir, mode, path, delay, retain=0):
    """Signals a blocking Python load `delay` s after it started; the latency (s) from the
    send to the child's KeyboardInterrupt, or None if the load ended first; with delay None,
    the load's length."""
    p = python_child(python_dir, ["blocking", mode, path], retain)
    start = float(p.stdout.readline().split()[1])
    if delay is None:
        out = p.communicate(timeout=600)[0].split()
        return float(out[1]) - start
    while time.monotonic() < start + delay and p.poll() is None:
        time.sleep(0.001)
    p.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out = p.communicate(timeout=60)[0].split()
    if not out or out[0] != "interrupted":
        return None
    return float(out[1]) - sent


def python_aload(python_dir, path, delay, retain=0):
    """An aload task cancelled `delay` s after its start: the latency (s) from task.cancel()
    to CancelledError, or None if the load ended first; with delay None, the load's length."""
    p = python_child(python_dir, ["aload", path, "-1" if delay is None else repr(delay)], retain)
    out = p.communicate(timeout=600)[0].split()
    if delay is None:
        return float(out[2])
    if not out or out[0] != "latency":
        return None
    return float(out[1])


def run_once(argv, delay):
    """Signals `argv` `delay` s after its start; returns the latency (s) or None if it ended first."""
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         preexec_fn=default_signals)
    deadline = time.monotonic() + delay
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(min(0.001, max(0.0, deadline - time.monotonic())))
    if p.poll() is not None:
        return None
    p.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return float("inf")
    return time.monotonic() - sent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("eredu")
    ap.add_argument("--big")
    ap.add_argument("--tiny")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--python", default=None)
    args = ap.parse_args()
    eredu = os.path.abspath(args.eredu)
    work = tempfile.mkdtemp(prefix="eredu-cancel-")
    try:
        big = args.big
        if not big:
            big = os.path.join(work, "big")
            subprocess.run([eredu, "gen", big, "--size", "2G", "-q"], check=True)
            subprocess.run([eredu, "gen", big + "-b", "--size", "2G", "--seed", "2", "-q"], check=True)
        tiny = args.tiny
        if not tiny:
            tiny = os.path.join(work, "tiny.safetensors")
            write_tiny(tiny, 100_000)
        big_bytes = sum(os.path.getsize(os.path.join(big, f)) for f in os.listdir(big)) \
            if os.path.isdir(big) else os.path.getsize(big)
        cases = {"sleep": ["sleep", "1000"], "hold big": [sys.executable, "-c", HOLD, str(big_bytes)]}
        for name, path in (("big", big), ("tiny", tiny)):
            cases[f"load {name}"] = [eredu, "load", path, "-q"]
            cases[f"read {name}"] = [eredu, "read", path, "-q"]
            cases[f"pipeline {name}"] = [eredu, "pipeline", path, "--passes", "3", "-q"]
        # The io_uring reader's cancellation of reads in flight, off: they finish instead.
        cases["load big, in-flight kept"] = ["env", "EREDU_URING_CANCEL_IN_FLIGHT=0", eredu, "load", big, "-q"]
        if not args.big:
            cases["swap big"] = [eredu, "swap", big, big + "-b", "--requests", "20000", "-q"]
        # Python cases: functions of the delay (None: the run's length), not command lines.
        if args.python:
            py = os.path.abspath(args.python)
            cases["py load_file big"] = lambda d: python_blocking(py, "load_file", big, d)
            cases["py safe_open.load big"] = lambda d: python_blocking(py, "safe_open", big, d)
            cases["py aload big cancel()"] = lambda d: python_aload(py, big, d)
            # The same with the partial unit's storage kept for reuse (set_storage_retention):
            # what freeing it, off the path to the exception, still costs the exception.
            keep = 2 * big_bytes
            cases["py load_file big, kept"] = lambda d: python_blocking(py, "load_file", big, d, keep)
            cases["py aload big cancel(), kept"] = lambda d: python_aload(py, big, d, keep)
        lengths = {}
        for name, argv in cases.items():
            if name == "sleep":
                lengths[name] = 1.0
                continue
            if name.startswith("hold"):
                lengths[name] = 4.0  # signalled once its pages are touched (about 1-2 s here)
                continue
            t = time.monotonic()
            if callable(argv):
                lengths[name] = argv(None)
            else:
                subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                lengths[name] = time.monotonic() - t
            print(f"{name}: a run takes {lengths[name]:.2f} s", flush=True)
        rng = random.Random(args.seed)
        rows = []
        names = list(cases)
        out = open(args.out or os.path.join(work, "cancel.jsonl"), "w")
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            rng.shuffle(order)
            for name in order:
                delay = rng.uniform(0.05, 0.95) * lengths[name]
                if name.startswith("hold"):
                    delay = rng.uniform(3.0, 4.0)  # after its pages are touched
                case = cases[name]
                latency = case(delay) if callable(case) else run_once(case, delay)
                row = {"bench": "cancel_latency", "round": r, "case": name, "delay_seconds": delay,
                       "latency_seconds": latency}
                rows.append(row)
                out.write(json.dumps(row) + "\n")
        out.close()

        def p99(v):
            s = sorted(v)
            return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]

        def latencies(name):
            return [r["latency_seconds"] * 1000 for r in rows
                    if r["case"] == name and r["latency_seconds"] is not None]

        floors = {n: p99(latencies(n)) for n in ("sleep", "hold big") if latencies(n)}
        for name in names:
            ms = latencies(name)
            ended = sum(1 for r in rows if r["case"] == name and r["latency_seconds"] is None)
            if not ms:
                print(f"{name:<22} every run ended before its signal ({ended})")
                continue
            extra = ""
            if name not in floors and "sleep" in floors:
                extra += f"  p99 - sleep's {p99(ms) - floors['sleep']:7.1f} ms"
            if name.endswith(" big") and name not in floors and "hold big" in floors:
                extra += f"  p99 / hold's {p99(ms) / floors['hold big']:5.2f}"
            print(f"{name:<22} n={len(ms):3d}  median {statistics.median(ms):7.1f} ms  p99 {p99(ms):7.1f} ms  "
                  f"({min(ms):.1f}-{max(ms):.1f}){extra}" + (f"  [{ended} ended first]" if ended else ""))
        print(f"rows: {args.out or 'discarded with the temporary directory'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
