#!/usr/bin/env python3
"""What each delta encoding would send for the two RL update patterns (docs/live_updates.md,
"Deltas"; docs/performance.md, "Live updates").

The issue asks to choose a delta encoding by measurement on both patterns of RL post-training:

  drift   most bf16 values change, each by a few units in the last place (a large step, or
          weights kept in bf16 by the optimizer);
  sparse  98-99 % of the bf16 values stay bit-identical: the fp32 master weights move by less
          than half a bf16 step, and the few that cross a rounding boundary are scattered.

For a bf16 tensor of N values it prints, per pattern, the share of the full bytes each encoding
sends, and how fast the publisher's side encodes (one core):

  blocks-64k, blocks-4k  the changed blocks (what eredu's Publisher sends where they are the
                         smaller, PublisherOptions::delta_block), bytes of changed blocks / all
                         bytes;
  elements               a sparse index of changed values: 4-byte index + 2-byte value each
                         (what the Publisher sends where it is smaller than the blocks);
  xor+zlib-1             the XOR with the base, compressed by zlib at level 1 (a general
                         compressor from the standard library);
  xor+zstd-1             the XOR with the base, compressed by zstd at level 1;
  xor-planes+zstd-1      the same with the XOR's bytes split into planes first (every value's
                         high byte, then every low byte), so that the high bytes, which a
                         change of a few units in the last place leaves zero, compress apart;
  xor+lz4-1, xor-planes+lz4-1   the same two with lz4.

Sizes are measured in Python (the zstd ones need Debian's python3-zstandard, so run it with
/usr/bin/python3; the lz4 ones need python3-lz4). The speeds of the XOR codecs are the
codecs' own, on one core, from the `zstd -b1` and `lz4 -b1` command-line benchmarks (Debian's
zstd and lz4 packages) run on the first round's XOR bytes: numpy's temporaries of this size
(fresh pages for every array) would otherwise be most of what is timed. A codec whose module
or command is missing is left out, with a message.

  usage: bench/delta_patterns.py [values (millions), default 64] [rounds, default 7]

Medians with min-max over the rounds, each round with fresh random weights and updates.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

try:
    import zstandard
except ImportError:  # Debian's python3-zstandard
    zstandard = None
try:
    import lz4.frame as lz4frame
except ImportError:  # Debian's python3-lz4
    lz4frame = None


def bf16(x):
    """float32 array → bf16 bits (uint16), rounded to nearest even."""
    bits = x.astype(np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def patterns(n, rng):
    master = rng.normal(0.0, 0.02, n).astype(np.float32)
    base = bf16(master)
    # drift: a relative step of 1e-2 (about 2.5 bf16 units in the last place)
    drift = bf16(master * (1.0 + rng.normal(0.0, 1e-2, n).astype(np.float32)))
    # sparse: a relative step of 1e-4 on the fp32 master weights
    sparse = bf16(master * (1.0 + rng.normal(0.0, 1e-4, n).astype(np.float32)))
    return base, {"drift": drift, "sparse": sparse}


def blocks(base, new, block_bytes):
    a = base.view(np.uint8)
    b = new.view(np.uint8)
    nblocks = (a.size + block_bytes - 1) // block_bytes
    pad = nblocks * block_bytes - a.size
    diff = np.concatenate([a != b, np.zeros(pad, dtype=bool)]).reshape(nblocks, block_bytes).any(axis=1)
    sizes = np.full(nblocks, block_bytes)
    sizes[-1] = block_bytes - pad  # the last block is short
    return float(sizes[diff].sum()) / a.size


def main():
    millions = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    n = millions * 1_000_000
    results = {}
    speeds = {}
    for r in range(rounds):
        rng = np.random.default_rng(r)
        base, updated = patterns(n, rng)
        for name, new in updated.items():
            row = results.setdefault(name, {})
            row.setdefault("values changed", []).append(float((base != new).mean()))
            row.setdefault("blocks-64k", []).append(blocks(base, new, 64 << 10))
            row.setdefault("blocks-4k", []).append(blocks(base, new, 4 << 10))
            t0 = time.perf_counter()
            changed = np.flatnonzero(base != new).astype(np.uint32)
            encoded = changed.tobytes() + new[changed].tobytes()
            row.setdefault("elements", []).append(len(encoded) / base.nbytes)
            row.setdefault("elements GB/s", []).append(base.nbytes / (time.perf_counter() - t0) / 1e9)
            x = (base ^ new).tobytes()
            planes = np.ascontiguousarray((base ^ new).view(np.uint8).reshape(-1, 2)[:, ::-1].T).tobytes()
            codecs = [("xor+zlib-1", x, lambda b: zlib.compress(b, 1))]
            if zstandard is not None:
                zc = zstandard.ZstdCompressor(level=1)
                codecs += [("xor+zstd-1", x, zc.compress), ("xor-planes+zstd-1", planes, zc.compress)]
            if lz4frame is not None:
                codecs += [("xor+lz4-1", x, lz4frame.compress), ("xor-planes+lz4-1", planes, lz4frame.compress)]
            for codec, data, compress in codecs:
                row.setdefault(codec, []).append(len(compress(data)) / base.nbytes)
            if r == 0:
                speeds[name] = cli_speeds(x, planes)
    for module, name in ((zstandard, "zstd (python3-zstandard)"), (lz4frame, "lz4 (python3-lz4)")):
        if module is None:
            print(f"{name} sizes left out: the module is missing (Debian's package; run with /usr/bin/python3)")
    print(f"{n * 2 / 2**20:.0f} MiB of bf16 per round, {rounds} rounds: share of the full bytes sent "
          "(median, min-max); the sparse index's encoding speed in numpy, on one core")
    for name, row in results.items():
        print(f"{name}:")
        for key, values in row.items():
            print(f"  {key:22s} {statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})")
        for codec, (compress, decompress) in speeds.get(name, {}).items():
            print(f"  {codec:22s} compresses at {compress:.2f} GB/s, decompresses at {decompress:.2f} GB/s "
                  "(its command's benchmark, one core)")


def cli_speeds(x, planes):
    """{codec: (compress GB/s, decompress GB/s)} from `zstd -b1` and `lz4 -b1` on the bytes."""
    out = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        for label, data in (("xor", x), ("xor-planes", planes)):
            path = os.path.join(d, label)
            with open(path, "wb") as f:
                f.write(data)
            for tool in ("zstd", "lz4"):
                if shutil.which(tool) is None:
                    print(f"{tool} speeds left out: no {tool} command (Debian's {tool} package)")
                    continue
                run = subprocess.run([tool, "-b1", path], capture_output=True, text=True)
                found = re.findall(r"([\d.]+) MB/s\s*,\s*([\d.]+) MB/s", run.stdout + run.stderr)
                if run.returncode != 0 or not found:
                    print(f"{tool} -b1 gave no speeds: {(run.stdout + run.stderr)[-300:]}")
                    continue
                compress, decompress = found[-1]
                out[f"{label}+{tool}-1"] = (float(compress) / 1e3, float(decompress) / 1e3)
    return out


if __name__ == "__main__":
    main()
