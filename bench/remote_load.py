#!/usr/bin/env python3
"""Loading a checkpoint over HTTP against downloading it, in the same rounds (issue 33).

A CHECKPOINT (one safetensors file; `eredu gen` writes it when missing) is served by nginx on
loopback (tests/remote/servers/nginx.py). Each round runs, in a fresh seeded shuffle:

  eredu-url    `eredu load http://.../model.safetensors --json` (the load's own seconds)
  curl         `curl -s -o /dev/null URL` (one stream; wall seconds)
  curl-tmpfs   the same into a file on tmpfs (one stream into memory, as a load must land)
  aria2c       `aria2c -x16 -s16` into a tmpfs directory (wall seconds; the file is removed)
  eredu-local  `eredu load PATH --json` of the same file, hot in the page cache
  eredu-cache  `eredu load URL --cache DIR` with the object already in DIR (a cache hit)

and prints, per contender, the median GB/s with min-max, and eredu-url's ratio to the faster of
curl and aria2c in the same round. --rate caps loopback with tc tbf (root; the cap is the
physical limit then), and --rtt-ms adds delay with tc netem where the kernel has it (this
harness says so and stops where it does not). Peak RSS is eredu's own report.

  python3 bench/remote_load.py --size 2G --rounds 7 [--rate 2gbit] [--rtt-ms 40]
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EREDU = os.path.join(ROOT, "build", "release", "tools", "eredu")
NGINX = os.path.join(ROOT, "tests", "remote", "servers", "nginx.py")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


class Nginx:
    def __init__(self, root):
        self.proc = subprocess.Popen([sys.executable, NGINX, "--root", root], stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            raise SystemExit(f"nginx did not start: {line}")
        self.url = line.split()[1]

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(10)


def shape_link(rate, rtt_ms):
    """Caps (tbf) and delays (netem) loopback; returns a description, or raises SystemExit."""
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    if rtt_ms:
        # Loopback carries both directions: half the RTT on each packet.
        cmd = ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{rtt_ms / 2}ms"]
        if rate:
            cmd += ["rate", rate]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"tc netem unavailable here ({' '.join(cmd)}: {r.stderr.strip()}); "
                             "the RTT rounds need a kernel with sch_netem")
        return f"netem delay {rtt_ms / 2} ms each way" + (f", rate {rate}" if rate else "")
    if rate:
        sh(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate, "burst", "4mb", "latency", "100ms"])
        return f"tbf rate {rate}"
    return "none"


def run_eredu(path, extra):
    out = sh([EREDU, "load", path, "--json", "-q", *extra]).stdout
    j = json.loads(out)
    return j["loads"][0]["seconds"], j["peak_rss_bytes"], j["staging_high_water_bytes"]


def timed(cmd):
    t = time.perf_counter()
    sh(cmd)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default="/dev/shm/eredu-remote-bench")
    ap.add_argument("--rate", help="tc rate of the capped link (e.g. 2gbit)")
    ap.add_argument("--rtt-ms", type=float, default=0)
    ap.add_argument("--connections", default="16")
    ap.add_argument("--part-size", default="8M")
    ap.add_argument("--only", help="comma-separated contenders")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    os.makedirs(a.dir, exist_ok=True)
    ck = os.path.join(a.dir, "model.safetensors")
    if not os.path.exists(ck) or abs(os.path.getsize(ck) - parse_size(a.size)) > parse_size(a.size) // 10:
        sh([EREDU, "gen", "--size", a.size, ck, "--force", "-q"])
    size = os.path.getsize(ck)
    aria_dir = os.path.join(a.dir, "aria")
    cache_dir = os.path.join(a.dir, "cache")
    nginx = Nginx(a.dir)
    url = f"{nginx.url}/model.safetensors"
    link = "none"
    try:
        link = shape_link(a.rate, a.rtt_ms)
        remote_flags = ["--connections", a.connections, "--part-size", a.part_size]
        cases = {
            "eredu-url": lambda: run_eredu(url, remote_flags),
            "curl": lambda: (timed(["curl", "-s", "-f", "-o", "/dev/null", url]), None, None),
            "curl-tmpfs": lambda: (timed(["curl", "-s", "-f", "-o", os.path.join(a.dir, "curl.out"), url]), None, None),
            "aria2c": lambda: (timed(["aria2c", "-q", "-x16", "-s16", "-k1M", "--file-allocation=none",
                                      "--allow-overwrite=true", "-d", aria_dir, "-o", "f", url]), None, None),
            "eredu-local": lambda: run_eredu(ck, []),
            # A cache hit: the header GET proves the ETag unchanged, then a local load of the copy.
            "eredu-cache": lambda: run_eredu(url, remote_flags + ["--cache", cache_dir]),
        }
        if a.only:
            cases = {k: v for k, v in cases.items() if k in a.only.split(",")}
        run_eredu(ck, [])  # the file hot in the page cache, as nginx serves it
        if "eredu-cache" in cases:
            run_eredu(url, remote_flags + ["--cache", cache_dir])  # fills the cache once
        rows = {k: [] for k in cases}
        rss = []
        ratios = []
        cache_ratios = []
        for r in range(1, a.rounds + 1):
            order = random.Random(f"{a.seed}-{r}").sample(list(cases), len(cases))
            got = {}
            for c in order:
                time.sleep(1)
                s, peak, staging = cases[c]()
                shutil.rmtree(aria_dir, ignore_errors=True)
                if os.path.exists(os.path.join(a.dir, "curl.out")):
                    os.unlink(os.path.join(a.dir, "curl.out"))
                got[c] = size / s / 1e9
                rows[c].append(got[c])
                if c == "eredu-url":
                    rss.append((peak, staging))
            if "eredu-cache" in got and "eredu-local" in got:
                cache_ratios.append(got["eredu-local"] / got["eredu-cache"])
            if "eredu-url" in got and ("curl" in got or "aria2c" in got):
                ratios.append(got["eredu-url"] / max(got.get("curl", 0), got.get("aria2c", 0)))
            print(f"round {r}: " + ", ".join(f"{c} {got[c]:.2f} GB/s" for c in order), file=sys.stderr)
    finally:
        if link != "none":
            subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
        nginx.stop()
        shutil.rmtree(aria_dir, ignore_errors=True)
        shutil.rmtree(cache_dir, ignore_errors=True)

    def med(v):
        return f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"

    print(f"checkpoint {size / 2**30:.2f} GiB, {a.rounds} rounds, link shaping: {link}, "
          f"eredu --connections {a.connections} --part-size {a.part_size}")
    print("| contender | GB/s median (min–max) |")
    print("|---|---|")
    for c, v in rows.items():
        print(f"| {c} | {med(v)} |")
    if ratios:
        print(f"eredu-url / faster of curl and aria2c, per round: {med(ratios)}")
    if cache_ratios:
        print(f"eredu-cache seconds / eredu-local seconds, per round: {med(cache_ratios)}")
    if rss:
        peak = max(p for p, _ in rss)
        print(f"eredu-url peak RSS {peak / 2**20:.0f} MiB (model {size / 2**20:.0f} MiB; staging high water "
              f"{max(s for _, s in rss) / 2**20:.0f} MiB); peak - model = {(peak - size) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
