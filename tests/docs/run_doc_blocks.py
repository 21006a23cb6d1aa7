#!/usr/bin/env python3
"""Every ```cpp (or ```c++) and ```python block of README.md and docs/*.md, compiled and run.

A doc example can never break unseen: tests/docs/CMakeLists.txt calls `extract` at configure
time, builds each C++ block as an executable of the build tree (warnings are errors, like the
package's own consumers) and registers one ctest case per block, named for its file and line.

  extract OUTDIR SOURCE_DIR DOC...   writes OUTDIR/<id>.cpp and OUTDIR/<id>.py and prints one
                                     line per block: id|kind|doc|line|needs (needs: cuda, mpi,
                                     nccl, tests, or empty), which the CMake list reads.
  fixture DIR EREDU                  the checkpoint every block may use (below), made once.
  run DIR DOC LINE (--exe PATH | --python FILE --pythonpath P) [--needs-device]
                                     runs one block in a fresh directory; a failure names
                                     DOC:LINE.

The convention a block can rely on (docs/testing.md, "Doc examples"):
  * it runs in a fresh temporary directory, its current directory, which holds `model/`
    (`eredu gen model --size 64M --checksums`: a Llama-shaped BF16 checkpoint, one shard,
    `model/model.safetensors`) and `model.safetensors` (the same file);
  * every `/tmp/` in a Python block's text is rewritten to that directory, so the docs'
    `/tmp/m` (`eredu gen /tmp/m --size 64M` in docs/python.md) is the same checkpoint, and
    whatever a block writes under /tmp lands there and goes with it (C++ blocks, compiled
    once, name `model/` and `model.safetensors` relative to the current directory);
  * a C++ block is a whole translation unit with its `main`, compiled as written (a `#line`
    directive makes the compiler's messages name the doc's own lines); a Python block is a
    whole script, run by /usr/bin/python3 (Debian's numpy and torch) with the build's package
    first on PYTHONPATH; its tracebacks name the doc's lines too.
A block whose text has the line `// Run it with: mpirun -np N` (`#` in Python) runs under mpirun
with N ranks.
There is no skip list: a block that is not a complete program is either made one or, when it
is not code at all (output, a grammar), fenced as what it is. A block that includes the test
suite's support headers ("support/...", docs/testing.md) is a Catch2 program with its own
main, built with tests/ on its include path. A C++ block that includes a CUDA,
MPI or NCCL header builds only where the build has that backend; one needing a GPU is built
but not run where no device is present, and says so.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^( *)```([A-Za-z0-9+]*)[^\n]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
KINDS = {"cpp": "cpp", "c++": "cpp", "python": "py"}


def blocks(path):
    """(kind, first line of the block's code, code) for each C++ or Python block of path."""
    text = open(path, encoding="utf-8").read()
    for m in FENCE.finditer(text):
        kind = KINDS.get(m.group(2).lower())
        if kind is None:
            continue
        indent = len(m.group(1))
        code = "".join(l[indent:] if l[:indent].strip() == "" else l for l in m.group(3).splitlines(True))
        yield kind, text.count("\n", 0, m.start()) + 2, code


def needs(code):
    found = [n for n in ("cuda", "mpi", "nccl") if re.search(rf'#include\s+"eredu/{n}/', code)]
    if re.search(r'#include\s+"support/', code):
        found.append("tests")  # a test of the suite's own kind: its support headers, Catch2
    return ",".join(found)


def write_if_changed(path, content):
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != content:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)


def extract(outdir, source_dir, docs):
    os.makedirs(outdir, exist_ok=True)
    written = set()
    for doc in docs:
        rel = os.path.relpath(doc, source_dir)
        for kind, line, code in blocks(doc):
            ident = re.sub(r"[^A-Za-z0-9]", "_", rel) + f"_{line}"
            if kind == "cpp":
                # Both the absolute path (for the compiler's messages to open) and the line.
                content = f'#line {line} "{os.path.abspath(doc)}"\n{code}'
            else:
                content = code
            name = f"{ident}.{kind}"
            write_if_changed(os.path.join(outdir, name), content)
            written.add(name)
            print(f"{ident}|{kind}|{rel}|{line}|{needs(code) if kind == 'cpp' else ''}")
    for stale in set(os.listdir(outdir)) - written:
        if os.path.isfile(os.path.join(outdir, stale)):
            os.remove(os.path.join(outdir, stale))


def fixture(directory, eredu):
    """model/ and model.safetensors, made once per build (a 64 MiB checkpoint takes a second)."""
    done = os.path.join(directory, "complete")
    recipe = "gen model --size 64M --checksums\n"  # remade when this changes
    if os.path.exists(done) and open(done, encoding="utf-8").read() == recipe:
        return 0
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    subprocess.run([eredu] + recipe.split()[:1] + [os.path.join(directory, "model")] + recipe.split()[2:] + ["-q"],
                   check=True)
    with open(done, "w", encoding="utf-8") as f:
        f.write(recipe)
    return 0


def has_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def mpirun_ranks(doc, line):
    """N when the block at doc:line says `// Run it with: mpirun -np N`, else None."""
    path = doc if os.path.isabs(doc) else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", doc)
    for _, first, code in blocks(path):
        if first == line:
            m = re.search(r"^(?://|#) Run it with: mpirun -np (\d+)", code, re.M)
            return int(m.group(1)) if m else None
    return None


def run(directory, doc, line, exe=None, python=None, pythonpath=None, needs_device=False):
    where = f"{doc}:{line}"
    if needs_device and not has_gpu():
        print(f"{where}: skipped: the block needs a GPU and this machine has none (nvidia-smi -L fails)")
        return 77
    if not os.path.exists(os.path.join(directory, "complete")):
        print(f"{where}: the fixture in {directory} is missing: run the `docs: fixture` test first")
        return 1
    runs = os.path.join(directory, "runs")
    os.makedirs(runs, exist_ok=True)
    cwd = tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9]", "_", where) + ".", dir=runs)
    # The block's own directory of symbolic links: what it writes beside the checkpoint (a
    # checksum sidecar, replaced by a rename) stays in its directory, and no byte is copied.
    # Not hard links: making one changes the file's ctime, and a block reading it meanwhile
    # would rightly fail with file_changed.
    model = os.path.join(cwd, "model")
    os.mkdir(model)
    for name in os.listdir(os.path.join(directory, "model")):
        os.symlink(os.path.join(directory, "model", name), os.path.join(model, name))
    os.symlink(os.path.join(directory, "model", "model.safetensors"), os.path.join(cwd, "model.safetensors"))
    # /tmp/m, the docs' name for the same checkpoint.
    os.symlink("model", os.path.join(cwd, "m"))
    tmp = cwd + "/"
    env = dict(os.environ)
    if exe is not None:
        if not os.path.exists(exe):
            print(f"{where}: the ```cpp block was not built ({exe}): see the `docs: build` test's output")
            return 1
        command = [exe]
    else:
        import glob
        if not glob.glob(os.path.join(pythonpath, "eredu", "_native*.so")):
            print(f"{where}: skipped: the ```python block needs the Python module, not built in {pythonpath}")
            return 77
        code = open(python, encoding="utf-8").read().replace("/tmp/", tmp)
        # Blank lines before the code make the traceback's line numbers the doc's.
        source = "\n" * (line - 1) + code
        script = os.path.join(cwd, "block.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(source)
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["EREDU_DOC_BLOCK"] = where
        # compile() names the doc: a traceback reads "docs/python.md", line N.
        command = ["/usr/bin/python3", "-c",
                   "import sys; src = open(sys.argv[1]).read(); "
                   "exec(compile(src, sys.argv[2], 'exec'), {'__name__': '__main__'})",
                   script, doc]
    # A block whose program needs several ranks says how it is launched on a line of its own,
    # `// Run it with: mpirun -np N ...` (or `# Run it with: ...`); it runs so, with the test
    # suite's mpirun flags.
    ranks = mpirun_ranks(doc, line)
    if ranks:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            print(f"{where}: skipped: the block runs under mpirun, which this machine lacks")
            return 77
        command = [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
                   "-np", str(ranks)] + command
    try:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        print(f"{where}: the block ran past 240 s\n{e.stdout or ''}{e.stderr or ''}")
        return 1
    sys.stdout.write(result.stdout)
    sys.stdout.write(result.stderr)
    if result.returncode != 0:
        kind = "cpp" if exe is not None else "python"
        print(f"{where}: the ```{kind} block failed (exit status {result.returncode}), run in {cwd}")
        return 1
    shutil.rmtree(cwd, ignore_errors=True)
    print(f"{where}: ok")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "extract":
        extract(argv[1], argv[2], argv[3:])
        return 0
    if len(argv) == 3 and argv[0] == "fixture":
        return fixture(argv[1], argv[2])
    if len(argv) >= 5 and argv[0] == "run":
        directory, doc, line = argv[1], argv[2], int(argv[3])
        rest = argv[4:]
        needs_device = "--needs-device" in rest
        rest = [a for a in rest if a != "--needs-device"]
        if rest[:1] == ["--exe"] and len(rest) == 2:
            return run(directory, doc, line, exe=rest[1], needs_device=needs_device)
        if rest[:1] == ["--python"] and len(rest) == 4 and rest[2] == "--pythonpath":
            return run(directory, doc, line, python=rest[1], pythonpath=rest[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
