#!/usr/bin/env python3
"""Plots a benchmark's rounds: one line per contender, its seconds (or GB/s) in every round,
so a reader sees the drift between rounds that the medians hide, and whether one contender's
lead holds round by round.

    /usr/bin/python3 bench/plot_rounds.py ROWS [ROWS ...] -o docs/img/first-loads.png [--rate] [--title T]

ROWS is what a harness wrote:
  * bench/first_load_ab.sh's JSON lines ({"round": r, "case": c, "seconds": s} per line), with
    A_NAME / B_NAME (--name A=..., --name B=...) naming its A and B;
  * bench/python_load.py --json ({"bytes": n, "rounds": {contender: [[seconds, bytes, rss], ...]}}).
Several files are drawn side by side, one panel each. --rate plots GB/s (needs the file's size:
python_load's JSON carries it; for first_load_ab give --bytes N). Needs Debian's
python3-matplotlib; draws without a display (Agg).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path


def load_rows(path):
    """{contender: [seconds per round, in round order]} and the byte count when the file has one."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "rounds" in doc:
        return {name: [r[0] for r in runs] for name, runs in doc["rounds"].items()}, doc.get("bytes")
    series = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            series.setdefault(row["case"], {})[int(row["round"])] = float(row["seconds"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"plot_rounds: {path}:{n}: not a first_load_ab row ({e}): {line[:80]}")
    if not series:
        raise SystemExit(f"plot_rounds: {path}: no rounds")
    return {case: [by_round[r] for r in sorted(by_round)] for case, by_round in series.items()}, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", help="JSON lines of first_load_ab.sh or the JSON of python_load.py --json")
    ap.add_argument("-o", "--output", required=True, help="image to write (.png or .svg)")
    ap.add_argument("--rate", action="store_true", help="plot GB/s instead of seconds")
    ap.add_argument("--bytes", type=int, help="bytes each load moves, for --rate on first_load_ab rows")
    ap.add_argument("--name", action="append", default=[], metavar="CASE=LABEL",
                    help="legend label of a case (e.g. A='eredu load --pages 4k')")
    ap.add_argument("--title", action="append", default=[], help="a panel's title (one per ROWS file)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot_rounds: needs matplotlib (Debian: apt-get install python3-matplotlib)")
    labels = {}
    for item in args.name:
        case, sep, label = item.partition("=")
        if not sep:
            raise SystemExit(f"plot_rounds: --name {item!r}: expected CASE=LABEL")
        labels[case] = label

    fig, axes = plt.subplots(1, len(args.rows), figsize=(6.5 * len(args.rows), 4.2), squeeze=False)
    for i, (path, ax) in enumerate(zip(args.rows, axes[0])):
        series, nbytes = load_rows(path)
        nbytes = nbytes or args.bytes
        if args.rate and not nbytes:
            raise SystemExit(f"plot_rounds: {path}: --rate needs --bytes (the file does not record its size)")
        for case, seconds in series.items():
            values = [nbytes / s / 1e9 for s in seconds] if args.rate else seconds
            median = statistics.median(values)
            ax.plot(range(1, len(values) + 1), values, marker="o", linewidth=1.2,
                    label=f"{labels.get(case, case)} (median {median:.2f})")
        ax.set_xlabel("round")
        ax.set_ylabel("GB/s" if args.rate else "seconds")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(args.title[i] if i < len(args.title) else Path(path).name, fontsize=10)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot_rounds: wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
