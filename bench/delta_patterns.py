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
                         compressor from the standard library; zstd is not a dependency).

  usage: bench/delta_patterns.py [values (millions), default 64] [rounds, default 7]

Medians with min-max over the rounds, each round with fresh random weights and updates.
"""
import statistics
import sys
import time
import zlib

import numpy as np


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
            t0 = time.perf_counter()
            packed = zlib.compress((base ^ new).tobytes(), 1)
            row.setdefault("xor+zlib-1", []).append(len(packed) / base.nbytes)
            row.setdefault("xor+zlib-1 GB/s", []).append(base.nbytes / (time.perf_counter() - t0) / 1e9)
    print(f"{n * 2 / 2**20:.0f} MiB of bf16 per round, {rounds} rounds: share of the full bytes sent "
          "(median, min-max); encoding speed on one core")
    for name, row in results.items():
        print(f"{name}:")
        for key, values in row.items():
            print(f"  {key:18s} {statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})")


if __name__ == "__main__":
    main()
