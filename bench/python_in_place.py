#!/usr/bin/env python3
"""An update of a serving model from Python: seconds, readers' pause and peak RSS of
eredu.InPlaceModelSlot's patch and swap against eredu.ModelSlot's swap, same files, same rounds.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_in_place.py [--size-mib 1024]
        [--changed 0.01] [--rounds 7] [--threads 1] [--dir /tmp/eredu-in-place-bench]

Two safetensors files of 16 F32 tensors: v1 random, v2 the same with a fraction `changed` of
its 64 KiB blocks replaced by other random bytes (an RL step's sparse update). Each contender
runs in a fresh process per round, in an order rotated each round; each loads v1 into its slot
(untimed), then updates it to v2 ("first": into memory the process never wrote, which these VMs
make slow), back to v1, and to v2 again (the steady state, the figures without "first"):

  ModelSlot.swap      the double-buffered slot: a second copy loaded, then published
  InPlace.swap        InPlaceModelSlot.swap_sync: a staged copy, written into the serving storage
  InPlace.patch       InPlaceModelSlot.patch_sync: only the 64-byte blocks that differ written

Seconds: the update call. Pause: the report's publish_pause_ns (ModelSlot: the publication;
in place: how long new reads were held back). Memory: the process's RSS once v1 is loaded, and
its peak (VmHWM) over the three updates. A slot keeps the storage its swap staged into for the
next swap, so after one swap a ModelSlot, and an InPlaceModelSlot that swaps, hold two copies. Each child checks, after
its update, that every tensor holds v2's bytes (SHA-256, untimed). Both files are read once
before the rounds (page-cache hot). Prints the median with min-max of each over the rounds, and
each contender's median of per-round ratios to ModelSlot.swap.
"""
import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

MIB = 1 << 20
BLOCK = 64 << 10
TENSORS = 16

CHILD = r"""
import hashlib, json, sys, time
import numpy as np
import eredu
how, v1, v2, digests, threads = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
slot = (eredu.ModelSlot if how == "ModelSlot.swap" else eredu.InPlaceModelSlot)(v1, threads=threads)
loaded = status("VmRSS")
def update(path):
    start = time.perf_counter()
    report = slot.patch_sync(path) if how == "InPlace.patch" else slot.swap_sync(path)
    return time.perf_counter() - start, report
first, first_report = update(v2)
update(v1)
seconds, report = update(v2)
def check(weights):
    for name, digest in digests.items():
        assert hashlib.sha256(np.ascontiguousarray(weights[name]).tobytes()).hexdigest() == digest, name
if how == "ModelSlot.swap":
    check(slot.current())
else:
    with slot.read() as weights:
        check(weights)
print(json.dumps({"seconds": seconds, "pause_ms": report["publish_pause_ns"] / 1e6,
                  "written_mib": report["written_bytes"] / (1 << 20), "first_seconds": first,
                  "first_pause_ms": first_report["publish_pause_ns"] / 1e6, "loaded_mib": loaded / (1 << 20),
                  "peak_mib": status("VmHWM") / (1 << 20)}))
"""


def write(path, arrays):
    header, offset = {}, 0
    for name, a in arrays.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for a in arrays.values():
            f.write(a.tobytes())


def make(directory, size_mib, changed, seed):
    rng = np.random.default_rng(seed)
    per = size_mib * MIB // TENSORS // 4
    v1 = {f"layers.{i}.weight": rng.standard_normal(per, dtype=np.float32).reshape(-1, 1024) for i in range(TENSORS)}
    v2, blocks = {}, 0
    for name, a in v1.items():
        b = a.copy()
        flat = b.reshape(-1).view(np.uint8)
        for k in np.flatnonzero(rng.random(flat.size // BLOCK) < changed):
            flat[k * BLOCK:(k + 1) * BLOCK] = rng.integers(0, 256, BLOCK, dtype=np.uint8)
            blocks += 1
        v2[name] = b
    directory.mkdir(parents=True, exist_ok=True)
    write(directory / "v1.safetensors", v1)
    write(directory / "v2.safetensors", v2)
    digests = {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in v2.items()}
    return digests, blocks, sum(a.nbytes for a in v1.values()) // BLOCK


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of 64 KiB blocks changed")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/eredu-in-place-bench"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="each slot's background threads (its `threads=`)")
    args = parser.parse_args()

    digests, blocks, total = make(args.dir, args.size_mib, args.changed, args.seed)
    v1, v2 = args.dir / "v1.safetensors", args.dir / "v2.safetensors"
    for f in (v1, v2):
        f.read_bytes()  # page-cache hot
    print(f"{args.size_mib} MiB, {TENSORS} F32 tensors; v2 differs in {blocks} of {total} 64 KiB blocks "
          f"({100 * blocks / total:.2f} %); threads={args.threads}")
    contenders = ["ModelSlot.swap", "InPlace.swap", "InPlace.patch"]
    rows = {c: [] for c in contenders}
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for c in order:
            out = subprocess.run([sys.executable, "-c", CHILD, c, str(v1), str(v2), json.dumps(digests),
                                  str(args.threads)],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"{c}, round {r}: failed\n{out.stdout}{out.stderr}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows[c].append(row)
            print(f"round {r} {c:15s} {row['seconds']:.3f} s  pause {row['pause_ms']:.3f} ms  "
                  f"written {row['written_mib']:.2f} MiB  first: {row['first_seconds']:.3f} s, pause "
                  f"{row['first_pause_ms']:.3f} ms  RSS loaded {row['loaded_mib']:.0f} MiB, peak "
                  f"{row['peak_mib']:.0f} MiB", flush=True)

    def med(values, fmt):
        return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"

    print(f"\n{args.rounds} rounds, median (min-max)")
    for prefix in ("", "first_"):
        print("steady state" if not prefix else "first update")
        base = [row[prefix + "seconds"] for row in rows["ModelSlot.swap"]]
        for c in contenders:
            seconds = [row[prefix + "seconds"] for row in rows[c]]
            ratio = [s / b for s, b in zip(seconds, base)]
            print(f"  {c:15s} {med(seconds, lambda v: f'{v:.3f}')} s  x ModelSlot.swap "
                  f"{med(ratio, lambda v: f'{v:.2f}')}  "
                  f"pause {med([row[prefix + 'pause_ms'] for row in rows[c]], lambda v: f'{v:.2f}')} ms")
    print("memory (MiB)")
    for c in contenders:
        print(f"  {c:15s} RSS loaded {med([row['loaded_mib'] for row in rows[c]], lambda v: f'{v:.0f}')}  "
              f"peak {med([row['peak_mib'] for row in rows[c]], lambda v: f'{v:.0f}')}")
    print("written by InPlace.patch: "
          f"{med([row['written_mib'] for row in rows['InPlace.patch']], lambda v: f'{v:.2f}')} MiB")


if __name__ == "__main__":
    main()
