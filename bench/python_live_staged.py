#!/usr/bin/env python3
"""A live update from a Python trainer: what staging costs against offering the memory, same
model, same rounds, under `mpirun -np 3` (rank 0 publishes, ranks 1 and 2 each swap a ModelSlot).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_live_staged.py [--size-mib 1024]
        [--rounds 7] [--transport two_sided]

The model: 16 torch bf16 tensors of size-mib in all, on the host (no GPU here). Two weight sets
alternate, so that every version differs from the one each server holds; none is published as a
delta. Each round publishes one version per contender, in an order rotated each round:

  offered   Publisher.publish(v, tensors): the tensors' memory is offered to MPI as it is
  staged    Publisher.publish(v, tensors, staged=True): every read (and every 8 MiB piece that
            publish() hashes) calls the package's copier with the GIL, which copies the asked
            bytes into the reply: the path a torch CUDA tensor now takes
  copied    Publisher.publish(v, {name: t.clone()}): a whole copy first, then offered, as a CUDA
            tensor was before (`.cpu()`, a device-to-host copy, which this host-to-host clone
            stands for); the copy is in the publish time, and is held until the withdrawal

Publish: rank 0's publish() call (the digests, hashed through the copier when staged; the
whole copy when copied). Swap:
the slower server's swap_sync of the opened version (its reads, verification and publication).
Each server checks the bytes of one tensor per version (untimed). Prints the median with
min-max of each, and the medians of per-round ratios, with the peak RSS (VmHWM) of each rank.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20
TENSORS = 16
CONTENDERS = ("offered", "staged", "copied")

WORKER = r"""
import json, sys, time
import numpy as np
import torch
import eredu
size_mib, rounds, transport, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
contenders = ("offered", "staged", "copied")
def peak():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
elements = size_mib * (1 << 20) // 2 // 16
def weights(seed, count=16):
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.weight": torch.randn(elements // 1024, 1024, generator=g).to(torch.bfloat16)
            for i in range(count)}
group = eredu.LiveGroup(timeout=120, transport=transport)
rank = group.rank
records = []
plan = [(r, contenders[(i + r) % 3]) for r in range(-1, rounds) for i in range(3)]  # round -1: warm-up
if rank == 0:
    sets = [weights(1), weights(2)]
    with eredu.Publisher(group, linger=120) as publisher:
        for n, (r, how) in enumerate(plan):
            start = time.perf_counter()
            tensors = sets[n % 2]
            if how == "copied":
                tensors = {k: t.clone() for k, t in tensors.items()}
            v = publisher.publish(f"v{n}", tensors, staged=(how == "staged"))
            publish_s = time.perf_counter() - start
            assert v.wait_served(2, 300) and v.served == 2, (v.served, v.failed)
            v.withdraw()
            del tensors
            records.append({"round": r, "how": how, "publish_s": publish_s})
else:
    expected = [weights(1, 1)["layers.0.weight"], weights(2, 1)["layers.0.weight"]]
    with eredu.Subscriber(group, publisher=0, timeout=120) as subscriber:
        slot = eredu.ModelSlot(framework="pt")
        for n, (r, how) in enumerate(plan):
            version = subscriber.open(f"v{n}", wait=300)
            start = time.perf_counter()
            slot.swap_sync(version)
            swap_s = time.perf_counter() - start
            del version
            assert torch.equal(slot.current()["layers.0.weight"].view(torch.int16),
                               expected[n % 2].view(torch.int16)), n
            records.append({"round": r, "how": how, "swap_s": swap_s})
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump({"peak": peak(), "records": records}, f)
"""


def summary(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--transport", default="two_sided", choices=("two_sided", "one_sided"))
    args = parser.parse_args()
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("python_live_staged: mpirun is not installed")
    with tempfile.TemporaryDirectory(prefix="eredu-live-staged-") as out:
        script = Path(out) / "worker.py"
        script.write_text(WORKER)
        command = [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "3",
                   sys.executable, str(script), str(args.size_mib), str(args.rounds), args.transport, out]
        subprocess.run(command, check=True, env=os.environ)
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(3)]
    publish = {(e["round"], e["how"]): e["publish_s"] for e in ranks[0]["records"]}
    swap = {}
    for rank in ranks[1:]:
        for e in rank["records"]:
            key = (e["round"], e["how"])
            swap[key] = max(swap.get(key, 0.0), e["swap_s"])
    rounds = range(args.rounds)
    print(f"{args.size_mib} MiB of bf16, {args.rounds} rounds, {args.transport}; seconds, median (min-max)")
    print(f"{'contender':<10} {'publish':<22} {'swap (slower server)':<22}")
    for how in CONTENDERS:
        print(f"{how:<10} {summary([publish[(r, how)] for r in rounds]):<22} "
              f"{summary([swap[(r, how)] for r in rounds]):<22}")
    for name, table in (("publish", publish), ("swap", swap)):
        for base in ("offered", "copied"):
            ratios = [table[(r, "staged")] / table[(r, base)] for r in rounds]
            print(f"staged / {base}, {name}, per round: {summary(ratios)}")
    totals = {how: [publish[(r, how)] + swap[(r, how)] for r in rounds] for how in CONTENDERS}
    print(f"publish + swap, staged / copied, per round: "
          f"{summary([s / c for s, c in zip(totals['staged'], totals['copied'])])}")
    print("peak RSS (VmHWM), MiB: " + ", ".join(f"rank {r} {ranks[r]['peak'] / MIB:.0f}" for r in range(3)))


if __name__ == "__main__":
    main()
