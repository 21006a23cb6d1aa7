#!/usr/bin/env python3
"""Writes every ```cpp block of a Markdown file to OUTDIR/snippet_<n>.cpp, exactly as written
(a comment line names its source line), and prints the files written, one per line. The
README's C++ snippets are complete translation units, and tests/package compiles them."""
import os
import re
import sys

markdown, outdir = sys.argv[1], sys.argv[2]
os.makedirs(outdir, exist_ok=True)
text = open(markdown, encoding="utf-8").read()
written = []
for n, m in enumerate(re.finditer(r"^```cpp\n(.*?)^```", text, flags=re.S | re.M)):
    line = text.count("\n", 0, m.start()) + 2
    path = os.path.join(outdir, f"snippet_{n}.cpp")
    content = f"// {os.path.basename(markdown)}:{line}\n{m.group(1)}"
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != content:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    written.append(path)
for stale in set(os.listdir(outdir)) - {os.path.basename(p) for p in written}:
    os.remove(os.path.join(outdir, stale))
print("\n".join(written))
