#!/usr/bin/env python3
"""Checks that no include runs up a layer: core < io < engine < backends < app < the
applications (tools, python, examples, bench). Every C++ and CUDA file under a layer's folder
may include eredu headers of its own layer or below; one that reaches higher is listed with
its line, and the check fails. Tests are applications of every layer and are not checked.

usage: scripts/check_layers.py [source root]"""
import os
import re
import sys

# Folder -> layer rank, and include prefix (eredu/<name>/) -> the rank of the layer holding it.
FOLDERS = {"core": 0, "io": 1, "engine": 2, "backends": 3, "app": 4,
           "tools": 5, "python": 5, "examples": 5, "bench": 5}
HEADERS = {"core": 0, "io": 1, "engine": 2, "cpu": 3, "cuda": 3, "mpi": 3, "nccl": 3, "app": 4,
           "synth": 5, "bench": 5}
NAMES = {0: "core", 1: "io", 2: "engine", 3: "backends", 4: "app", 5: "applications"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]eredu/([A-Za-z0-9_]+)/')
SOURCES = (".cpp", ".hpp", ".h", ".inc", ".cu", ".cuh")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems, checked = [], 0
    for folder, rank in FOLDERS.items():
        for directory, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(directory, name)
                checked += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = HEADERS.get(m[1])
                        if target is None:
                            problems.append(f"{os.path.relpath(path, root)}:{number}: eredu/{m[1]}/ is in no known layer")
                        elif target > rank:
                            problems.append(f"{os.path.relpath(path, root)}:{number}: {NAMES[rank]} includes "
                                            f"{NAMES[target]} (eredu/{m[1]}/)")
    if checked == 0:
        print(f"layers: no sources found under {root}", file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"layers: {len(problems)} include(s) run up a layer", file=sys.stderr)
        return 1
    print(f"layers: {checked} files, no include runs up a layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
