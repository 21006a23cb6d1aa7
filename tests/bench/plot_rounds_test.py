#!/usr/bin/env python3
"""bench/plot_rounds.py: draws first_load_ab.sh rows and python_load.py JSON into a PNG, and
refuses a malformed row with a message naming the file and line. Exits 77 (ctest's skip)
without matplotlib."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import matplotlib  # noqa: F401
except ImportError:
    print("skipped: no matplotlib for this interpreter (Debian: python3-matplotlib)")
    sys.exit(77)

root = Path(sys.argv[1])
script = root / "bench" / "plot_rounds.py"
failures = []


def check(ok, message):
    if not ok:
        failures.append(message)


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    rows = tmp / "ab.jsonl"
    rows.write_text("".join(json.dumps({"round": r, "case": c, "seconds": s}) + "\n"
                            for r in (1, 2, 3) for c, s in (("A", 1.0 + r / 10), ("B", 2.0), ("blocks", 1.5))))
    py = tmp / "py.json"
    py.write_text(json.dumps({"bytes": 2_000_000_000,
                              "rounds": {"eredu.load_file": [[1.2, 1, 1], [1.3, 1, 1]], "torch.load": [[3.0, 1, 1], [2.8, 1, 1]]}}))
    out = tmp / "plot.png"
    p = subprocess.run([sys.executable, str(script), str(rows), str(py), "-o", str(out), "--rate", "--bytes",
                        "2000000000", "--name", "A=eredu load"], capture_output=True, text=True)
    check(p.returncode == 0, f"plot_rounds failed: {p.stderr}")
    check(out.exists() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "no PNG was written")
    bad = tmp / "bad.jsonl"
    bad.write_text('{"round": 1, "case": "A", "seconds": 1.0}\n{"round": 2, "seconds": 1.0}\n')
    p = subprocess.run([sys.executable, str(script), str(bad), "-o", str(tmp / "x.png")], capture_output=True, text=True)
    check(p.returncode != 0 and "bad.jsonl:2" in p.stderr, f"a row without a case: exit {p.returncode}: {p.stderr}")
    check(not (tmp / "x.png").exists(), "a malformed file still produced a plot")
    p = subprocess.run([sys.executable, str(script), str(rows), "-o", str(tmp / "y.png"), "--rate"],
                       capture_output=True, text=True)
    check(p.returncode != 0 and "--bytes" in p.stderr, f"--rate without a size: exit {p.returncode}: {p.stderr}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
