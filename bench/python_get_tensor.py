#!/usr/bin/env python3
"""The Hugging Face idiom — a get_tensor loop over keys() — against f.load(), same file, same run.

    /usr/bin/python3 bench/python_get_tensor.py [--size 512M] [--rounds 7] [--settle 3]
                                                [--dir /tmp/eredu-get-tensor-bench] [--build build/release]
                                                [--before OTHER_BUILD] [--only A,B] [--json FILE]

Contenders, each in a fresh process per round, in a rotated order (round r starts at contender
r), on one page-cache-hot file `eredu gen` wrote (BF16, Llama-shaped), framework="np":
  get_tensor keys()         with safe_open: {k: f.get_tensor(k) for k in f.keys()}   (sorted names)
  get_tensor offset_keys()  the same loop in file order
  ... readahead             both loops with safe_open(..., readahead="256M") (where the build has it)
  f.load()                  every tensor as one unit
  np.memmap+copy            safetensors-style: mmap the file, copy each tensor out
Prints each one's median and min-max seconds, and the get_tensor loops' ratio to f.load(), both of
the medians and as the median of the same-round ratios. `--before` names another build (e.g. one
of an older commit): its get_tensor keys(), get_tensor offset_keys() and f.load() then run in the
same rounds, as "before: ...", and their ratio is printed too. The machine is shared: say so
when you quote the figures.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = {
    "get_tensor keys()": """
        import eredu, numpy
        t0 = time.perf_counter()
        with eredu.safe_open(PATH, "np") as f:
            d = {k: f.get_tensor(k) for k in f.keys()}
        t1 = time.perf_counter()
    """,
    "get_tensor offset_keys()": """
        import eredu, numpy
        t0 = time.perf_counter()
        with eredu.safe_open(PATH, "np") as f:
            d = {k: f.get_tensor(k) for k in f.offset_keys()}
        t1 = time.perf_counter()
    """,
    "get_tensor keys() readahead": """
        import eredu, numpy
        t0 = time.perf_counter()
        with eredu.safe_open(PATH, "np", readahead="256M") as f:
            d = {k: f.get_tensor(k) for k in f.keys()}
        t1 = time.perf_counter()
    """,
    "get_tensor offset_keys() readahead": """
        import eredu, numpy
        t0 = time.perf_counter()
        with eredu.safe_open(PATH, "np", readahead="256M") as f:
            d = {k: f.get_tensor(k) for k in f.offset_keys()}
        t1 = time.perf_counter()
    """,
    "f.load()": """
        import eredu, numpy
        t0 = time.perf_counter()
        with eredu.safe_open(PATH, "np") as f:
            d = f.load()
        t1 = time.perf_counter()
    """,
    "np.memmap+copy": """
        import json, struct, numpy as np
        t0 = time.perf_counter()
        with open(PATH, "rb") as f:
            hlen = struct.unpack("<Q", f.read(8))[0]; header = json.loads(f.read(hlen))
        header.pop("__metadata__", None)
        m = np.memmap(PATH, dtype=np.uint8, mode="r")
        base = 8 + hlen
        d = {k: np.array(m[base + v["data_offsets"][0]:base + v["data_offsets"][1]]) for k, v in sorted(header.items())}
        t1 = time.perf_counter()
    """,
}
PRELUDE = "import resource, sys, time\nPATH = sys.argv[1]\n"
GO = "sys.stdin.readline()\n"
EPILOGUE = "print(t1 - t0, sum(a.nbytes for a in d.values()))\n"


def run(name, path, env, start_at):
    body = textwrap.dedent(CHILD[name])
    imports, timed = body.split("t0 = ", 1)  # the imports run before the "go", the timed part after it
    code = PRELUDE + imports + GO + "t0 = " + timed + EPILOGUE
    child = subprocess.Popen([sys.executable, "-c", code, str(path)], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(max(0.0, start_at - time.monotonic()))
    out, err = child.communicate("go\n")
    if child.returncode != 0:
        raise SystemExit(f"{name} failed:\n{err}")
    seconds, nbytes = out.split()
    return float(seconds), int(nbytes)


def has_readahead(env):
    code = "import inspect, eredu; print('readahead' in inspect.signature(eredu.safe_open.__init__).parameters)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="512M")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default="/tmp/eredu-get-tensor-bench")
    ap.add_argument("--build", default=str(REPO / "build" / "release"))
    ap.add_argument("--cli", help="the eredu command that generates the file (default: the build's)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds between one contender's exit and the next one's load (default 3)")
    ap.add_argument("--before", help="another build whose get_tensor loops and f.load() run in the same rounds")
    ap.add_argument("--only", help="comma-separated contenders to run (f.load() always runs)")
    ap.add_argument("--json", help="also write every round's (seconds, bytes) per contender here")
    args = ap.parse_args()
    build = Path(args.build).resolve()
    env = dict(os.environ, PYTHONPATH=str(build / "python"))
    path = Path(args.dir) / f"model-{args.size}" / "model.safetensors"
    if not path.exists():
        subprocess.run([args.cli or str(build / "tools" / "eredu"), "gen", str(path.parent), "--size", args.size],
                       check=True)
    with open(path, "rb") as h:  # page-cache hot
        while h.read(64 << 20):
            pass
    names = list(CHILD)
    if not has_readahead(env):
        names = [n for n in names if not n.endswith(" readahead")]
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")} | {"f.load()"}
        unknown = wanted - set(CHILD)
        if unknown:
            raise SystemExit(f"--only: unknown contender(s) {', '.join(sorted(unknown))} (known: {', '.join(CHILD)})")
        names = [n for n in names if n in wanted]
    envs = {n: (n, env) for n in names}
    if args.before:
        before_env = dict(os.environ, PYTHONPATH=str(Path(args.before).resolve() / "python"))
        for n in ("get_tensor keys()", "get_tensor offset_keys()", "f.load()"):
            if n in names:
                envs["before: " + n] = (n, before_env)
        names = list(envs)
    results = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            child, child_env = envs[n]
            results[n].append(run(child, path, child_env, time.monotonic() + args.settle))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {results[n][-1][0]:.3f}s" for n in order),
              file=sys.stderr)

    nbytes = results["f.load()"][0][1]
    for n in names:
        if any(b != nbytes for _, b in results[n]):
            raise SystemExit(f"{n} returned {results[n][0][1]} bytes, f.load() {nbytes}")
    med = {n: statistics.median(s for s, _ in results[n]) for n in names}
    print(f"\n{path} ({nbytes / 1e9:.2f} GB of tensors, page-cache hot), build {build}"
          f"{f', before: {args.before}' if args.before else ''}, {args.rounds} rotated "
          f"rounds, each load {args.settle:g} s after the previous contender exited; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'contender':<34} {'median s':>9} {'min-max s':>15} {'GB/s':>7}")
    for n in names:
        s = [x for x, _ in results[n]]
        print(f"{n:<34} {med[n]:9.3f} {min(s):7.3f}-{max(s):<7.3f} {nbytes / med[n] / 1e9:7.2f}")
    print()
    for n in names:
        # Each build's loops against its own f.load(), the baseline against this build's.
        ref = "before: f.load()" if n.startswith("before: ") else "f.load()"
        if n == ref or ref not in results:
            continue
        same = sorted(s / l for (s, _), (l, _) in zip(results[n], results[ref]))
        print(f"{n} / {ref}: {med[n] / med[ref]:.2f}x of medians, same-round "
              f"{statistics.median(same):.2f}x [{same[0]:.2f}-{same[-1]:.2f}]")
    if args.json:
        Path(args.json).write_text(json.dumps({"bytes": nbytes, "rounds": results}, indent=1))


if __name__ == "__main__":
    main()
