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

Prints per case the median, p99 and min-max of the latency over the rounds, and the p99's
excess over sleep's; writes one JSON line per run.

usage: bench/cancel_latency.py EREDU [--big PATH] [--tiny PATH] [--rounds 20] [--out FILE]
  --big   a large checkpoint (default: eredu gen of 2 GiB in a temporary directory)
  --tiny  a checkpoint of many tiny tensors (default: 100 000 one-byte U8 tensors, written)
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
        if not args.big:
            cases["swap big"] = [eredu, "swap", big, big + "-b", "--requests", "20000", "-q"]
        lengths = {}
        for name, argv in cases.items():
            if name == "sleep":
                lengths[name] = 1.0
                continue
            if name.startswith("hold"):
                lengths[name] = 4.0  # signalled once its pages are touched (about 1-2 s here)
                continue
            t = time.monotonic()
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
                latency = run_once(cases[name], delay)
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
                print(f"{name:<16} every run ended before its signal ({ended})")
                continue
            extra = ""
            if name not in floors and "sleep" in floors:
                extra += f"  p99 - sleep's {p99(ms) - floors['sleep']:7.1f} ms"
            if name.endswith(" big") and name not in floors and "hold big" in floors:
                extra += f"  p99 / hold's {p99(ms) / floors['hold big']:5.2f}"
            print(f"{name:<16} n={len(ms):3d}  median {statistics.median(ms):7.1f} ms  p99 {p99(ms):7.1f} ms  "
                  f"({min(ms):.1f}-{max(ms):.1f}){extra}" + (f"  [{ended} ended first]" if ended else ""))
        print(f"rows: {args.out or 'discarded with the temporary directory'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
