#!/usr/bin/env python3
"""Loading a checkpoint into a torch model: seconds and peak RSS, eredu.torch.load_model against
the two ways users do it today, same weights, same rounds.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_load_model.py [--rounds 7]
        [--dir /tmp/eredu-load-model-bench] [--layers 8] [--dim 1024] [--vocab 32768]

The model is GPT-like (an embedding tied to the lm_head, `layers` blocks of attention and MLP
projections, F32): 537 MB with the defaults. It is saved once with eredu.torch.save_model
(safetensors) and once with torch.save (the same tensors, ties kept), then each contender runs in
a fresh process per round, in an order rotated each round:

  load_model          eredu.torch.load_model into an existing model (read into its parameters)
  load_model(meta)    eredu.torch.load_model into a model built on the meta device (assigned)
  load_file+lsd       model.load_state_dict(eredu.torch.load_file(path), strict=False) (save_model
                      wrote the tied lm_head once, under embed.weight)
  torch.load+lsd      model.load_state_dict(torch.load(path.pt))
  torch.load(mmap)+lsd  model.load_state_dict(torch.load(path.pt, mmap=True)) (where torch has mmap=:
                      2.1 and later; Debian's 1.13 has not)
  safetensors.load_model  safetensors.torch.load_model(model, path) (where safetensors is installed)

An existing model is built on the meta device, given memory with to_empty, re-tied and zeroed
before the timer starts: its bytes are resident, as after a real initialisation, and the baseline
RSS (after import torch and the model's construction) includes them. Seconds: the load call only.
Peak: the process's VmHWM, reset (clear_refs 5) once the model is built, and its growth over
that baseline. Every file is page-cache hot
(read once before the rounds). Prints the median with min-max of each.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20

MODEL = """
import torch

class Block(torch.nn.Module):
    def __init__(self, dim, device):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim, device=device)
        self.proj = torch.nn.Linear(dim, dim, device=device)
        self.up = torch.nn.Linear(dim, 4 * dim, device=device)
        self.down = torch.nn.Linear(4 * dim, dim, device=device)
        self.norm = torch.nn.LayerNorm(dim, device=device)

class GPT(torch.nn.Module):
    def __init__(self, vocab, dim, layers, device=None):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim, device=device)
        self.blocks = torch.nn.ModuleList(Block(dim, device) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim, device=device)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False, device=device)
        self.lm_head.weight = self.embed.weight

def existing(vocab, dim, layers):
    model = GPT(vocab, dim, layers, device="meta").to_empty(device="cpu")
    model.lm_head.weight = model.embed.weight  # to_empty gave each name its own tensor
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # resident, as after a real initialisation
    return model
"""

CHILD = MODEL + """
import json, resource, sys, time
import eredu.torch
how, st, pt, vocab, dim, layers = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
model = GPT(vocab, dim, layers, device="meta") if how == "load_model(meta)" else existing(vocab, dim, layers)
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
# The load's own peak: the high-water mark reset after import torch and the model's construction
# (a CUDA build of torch peaks far above where it settles while it imports).
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
baseline = status("VmRSS")
t0 = time.perf_counter()
if how in ("load_model", "load_model(meta)"):
    eredu.torch.load_model(model, st)
elif how == "load_file+lsd":
    model.load_state_dict(eredu.torch.load_file(st), strict=False)  # the file names the tied weight once
elif how == "torch.load(mmap)+lsd":
    model.load_state_dict(torch.load(pt, mmap=True, weights_only=True))
elif how == "safetensors.load_model":
    import safetensors.torch
    safetensors.torch.load_model(model, st)
else:
    model.load_state_dict(torch.load(pt))
seconds = time.perf_counter() - t0
assert model.lm_head.weight is model.embed.weight
check = float(model.blocks[-1].down.weight[-1, -8:].sum()) + float(model.embed.weight[-1, :8].sum())
print(json.dumps({"seconds": seconds, "peak": status("VmHWM"),
                  "baseline": baseline, "check": check}))
"""

SETUP = MODEL + """
import sys, torch
import eredu.torch
st, pt, vocab, dim, layers = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
model = GPT(vocab, dim, layers)
eredu.torch.save_model(model, st)
torch.save(model.state_dict(), pt)
print(sum(p.numel() * p.element_size() for p in model.parameters()))
"""

CONTENDERS = ["load_model", "load_model(meta)", "load_file+lsd", "torch.load+lsd"]
# Contenders this interpreter may lack: (name, the check that it can run here).
OPTIONAL = [("torch.load(mmap)+lsd", "import inspect, torch; assert 'mmap' in inspect.signature(torch.load).parameters"),
            ("safetensors.load_model", "import safetensors.torch")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default="/tmp/eredu-load-model-bench")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--only", help="comma-separated contenders to run (default: every one this interpreter can)")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    st, pt = d / "model.safetensors", d / "model.pt"
    shape = [str(args.vocab), str(args.dim), str(args.layers)]
    nbytes = int(subprocess.run([sys.executable, "-c", SETUP, str(st), str(pt), *shape], check=True,
                                capture_output=True, text=True).stdout)
    for f in (st, pt):
        with open(f, "rb") as h:
            while h.read(64 * MIB):
                pass  # page-cache hot for every contender
    print(f"model: {nbytes / 1e6:.0f} MB of parameters (tied lm_head counted once); files: "
          f"{st.stat().st_size / 1e6:.0f} MB safetensors, {pt.stat().st_size / 1e6:.0f} MB torch.save")
    contenders = CONTENDERS + [name for name, check in OPTIONAL
                               if subprocess.run([sys.executable, "-c", check], capture_output=True).returncode == 0]
    if args.only:
        contenders = [c for c in contenders if c in args.only.split(",")]
    runs = {c: [] for c in contenders}
    checks = {}
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for c in order:
            out = subprocess.run([sys.executable, "-c", CHILD, c, str(st), str(pt), *shape], capture_output=True,
                                 text=True)
            if out.returncode:
                sys.exit(f"{c} failed:\n{out.stderr}")
            res = json.loads(out.stdout)
            runs[c].append(res)
            checks.setdefault(res["check"], []).append(c)
            print(f"round {r + 1} {c:22s} {res['seconds']:.3f} s  peak {res['peak'] / MIB:.0f} MiB  "
                  f"(+{(res['peak'] - res['baseline']) / MIB:.0f} over {res['baseline'] / MIB:.0f})", flush=True)
    if len(checks) != 1:
        sys.exit(f"contenders loaded different weights: {checks}")

    def med(values, fmt):
        return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"

    print(f"\n{args.rounds} rounds, median (min-max)")
    print(f"{'contender':22s} | {'seconds':22s} | {'peak RSS MiB':18s} | {'peak over baseline MiB':22s}")
    for c in contenders:
        rs = runs[c]
        print(f"{c:22s} | {med([x['seconds'] for x in rs], lambda v: f'{v:.2f}'):22s} | "
              f"{med([x['peak'] / MIB for x in rs], lambda v: f'{v:.0f}'):18s} | "
              f"{med([(x['peak'] - x['baseline']) / MIB for x in rs], lambda v: f'{v:.0f}'):22s}")


if __name__ == "__main__":
    main()
