# The documented installs (docs/python.md, Install) give a package that works on its own, each
# run as written, offline (no package index), and used from a temporary directory outside the
# source and build trees, with nothing of either on sys.path:
#   * pip install --target DIR ./python, reusing the build (EREDU_BUILD_DIR, relative, from the
#     checkout's root);
#   * the wheel of scripts/wheel.sh, installed into a venv made with --system-site-packages
#     (Debian's numpy and torch);
#   * cmake --install BUILD --prefix P: every file under P, the package under P's platlib.
# Each reuses this build (EREDU_BUILD_DIR, which ctest sets) rather than building the extension again.
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import eredu
from conftest import REPO

BUILD = Path(os.environ["EREDU_BUILD_DIR"]).resolve() if os.environ.get("EREDU_BUILD_DIR") else None
needs_build = pytest.mark.skipif(BUILD is None, reason="needs EREDU_BUILD_DIR (ctest sets it)")
needs_pip = pytest.mark.skipif(
    subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0,
    reason=f"{sys.executable} has no pip (Debian: python3-pip)")

# What the documented commands see: no index, and none of this test's own eredu.
OFFLINE = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("EREDU_")}
OFFLINE.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")

ROWS = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)

LOAD = """
import sys, eredu
site, path, frameworks = sys.argv[1], sys.argv[2], sys.argv[3:]
assert eredu.__file__.startswith(site + "/"), f"eredu imported from {eredu.__file__}, not from {site}"
for fw in frameworks:
    rows = eredu.load_file(path, framework=fw)["rows"]
    print(fw, str(rows.dtype), tuple(rows.shape), float(rows.sum()))
"""


def run(cmd, **kwargs):
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def load_outside(python, site, tmp_path, writer, frameworks=("np",), pythonpath=None):
    """Loads a checkpoint with the eredu that `python` imports from `site`, in a fresh directory."""
    path = writer(tmp_path / "m.safetensors", {"rows": ROWS})
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = dict(OFFLINE, PYTHONPATH=str(pythonpath)) if pythonpath else OFFLINE
    out = run([str(python), "-c", LOAD, str(site), str(path), *frameworks], cwd=cwd, env=env)
    expected = {"np": "float32", "pt": "torch.float32"}
    assert out.splitlines() == [f"{fw} {expected[fw]} (64, 256) {float(ROWS.sum())}" for fw in frameworks]


def installed_python_files(site):
    return sorted(p.name for p in (site / "eredu").glob("*.py"))


SOURCE_FILES = sorted(p.name for p in (REPO / "python" / "eredu").glob("*.py"))


@needs_build
@needs_pip
def test_pip_install_target_with_a_relative_build_dir(tmp_path, writer):
    # As documented: from the checkout's root, without --no-deps (the package declares no
    # dependency for pip to fetch), EREDU_BUILD_DIR relative to where pip runs (not python/).
    target = tmp_path / "site"
    env = dict(OFFLINE, EREDU_BUILD_DIR=os.path.relpath(BUILD, REPO))
    run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "-q", "--target", str(target), "./python"],
        cwd=REPO, env=env)
    assert sorted(p.name for p in (target / "eredu").glob("_native*.so")), list((target / "eredu").iterdir())
    assert installed_python_files(target) == SOURCE_FILES
    load_outside(sys.executable, target, tmp_path, writer, pythonpath=target)


@needs_build
@needs_pip
def test_wheel_into_a_clean_venv(tmp_path, writer):
    wheel = Path(run(["bash", str(REPO / "scripts" / "wheel.sh"), str(BUILD), str(tmp_path / "dist")],
                     env=OFFLINE).strip().splitlines()[-1])
    version = eredu.__version__
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel.name.startswith(f"eredu-{version}-{tag}-{tag}-") and wheel.suffix == ".whl", wheel
    assert [p.name for p in wheel.parent.iterdir()] == [wheel.name]

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], env=OFFLINE)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", str(wheel)], env=OFFLINE)
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                    env=OFFLINE).strip())
    assert site.is_relative_to(venv), site
    assert installed_python_files(site) == SOURCE_FILES
    # Debian's numpy and torch, through --system-site-packages.
    frameworks = ["np"]
    if subprocess.run([str(python), "-c", "import torch"], env=OFFLINE, capture_output=True).returncode == 0:
        frameworks.append("pt")
    load_outside(python, site, tmp_path, writer, frameworks)


def cached(name):
    for line in (BUILD / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split("=", 1)[1]
    return None


@needs_build
def test_cmake_install_puts_everything_under_the_prefix(tmp_path, writer):
    prefix = tmp_path / "prefix"
    run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], env=OFFLINE)
    installed = (BUILD / "install_manifest.txt").read_text().split()
    assert installed, "cmake --install installed nothing"
    outside = [f for f in installed if not Path(f).is_relative_to(prefix)]
    assert not outside, f"installed outside {prefix}: {outside}"

    relative = cached("EREDU_PYTHON_INSTALL_DIR")
    assert relative and not os.path.isabs(relative), f"EREDU_PYTHON_INSTALL_DIR={relative}: not under the prefix"
    site = prefix / relative
    assert str(site / "eredu" / "__init__.py") in installed
    assert installed_python_files(site) == SOURCE_FILES
    assert sorted(p.name for p in (site / "eredu").glob("_native*.so")), list((site / "eredu").iterdir())
    assert (prefix / "bin" / "eredu").is_file() or cached("EREDU_BUILD_TOOLS") == "OFF"
    load_outside(sys.executable, site, tmp_path, writer, pythonpath=site)
