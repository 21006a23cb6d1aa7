# `pip install ./python` (python/setup.py) gives a package that works on its own: installed with
# pip into a --target directory, reusing this build (EREDU_BUILD_DIR, which ctest sets), then
# imported and used from outside the source and build trees.
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import eredu
from conftest import REPO


def pip_available():
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not os.environ.get("EREDU_BUILD_DIR"), reason="needs EREDU_BUILD_DIR (ctest sets it)")
@pytest.mark.skipif(not pip_available(), reason=f"{sys.executable} has no pip (Debian: python3-pip)")
def test_pip_install_into_a_target_directory(tmp_path, writer):
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)  # pip must not see the build tree's eredu
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q",
                           "--target", str(target), str(REPO / "python")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (target / "eredu").glob("_native*.so")), list((target / "eredu").iterdir())

    rows = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    path = writer(tmp_path / "m.safetensors", {"rows": rows})
    code = ("import sys, numpy as np, eredu\n"
            "assert eredu.__file__.startswith(sys.argv[1]), eredu.__file__\n"
            "d = eredu.load_file(sys.argv[2])\n"
            "print(eredu.__version__, d['rows'].dtype, d['rows'].shape, float(d['rows'].sum()))\n")
    run = subprocess.run([sys.executable, "-c", code, str(target), str(path)], cwd="/",
                         env=dict(env, PYTHONPATH=str(target), PYTHONNOUSERSITE="1"), capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == [eredu.__version__, "float32", "(64,", "256)", str(float(rows.sum()))]
