"""pip's entry to the `eredu` module: the extension eredu._native is built by the project's CMake
(the same target `cmake --build` builds, linking eredu's static libraries), then packaged with
the pure-Python files of python/eredu.

    python3 -m pip install --no-build-isolation ./python            # configures and builds build/python-package
    EREDU_BUILD_DIR=build/release python3 -m pip install --no-build-isolation ./python   # reuses a build
    bash scripts/wheel.sh build/release                               # dist/eredu-<version>-cp311-...whl

The build is for the interpreter running pip (-DPython3_EXECUTABLE=sys.executable). A relative
EREDU_BUILD_DIR is taken from the directory pip was run in, not from python/ (where pip runs
this file).
"""
import atexit
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VERSION = re.search(r"project\(eredu VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text()).group(1)


def invocation_directory():
    """The working directory of the command the user typed. pip (and `python -m build`) run this file
    in a child process whose working directory is python/; the parent's is the user's. Without
    /proc, or without such a parent, the shell's $PWD, then our own."""
    try:
        return Path(os.readlink(f"/proc/{os.getppid()}/cwd"))
    except OSError:
        return Path(os.environ.get("PWD") or os.getcwd())


def cmake_build_dir():
    """EREDU_BUILD_DIR (a relative one from where pip was run), or the package's own build tree."""
    given = os.environ.get("EREDU_BUILD_DIR")
    if not given:
        return ROOT / "build" / "python-package", False
    return (invocation_directory() / given).resolve(), True


class CMakeExtension(Extension):
    """An extension whose sources CMake knows: setuptools only gets the built file."""

    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures (once) and builds the eredu_python target, then copies _native*.so where setuptools wants it."""

    def build_extension(self, ext):
        build, given = cmake_build_dir()
        if not (build / "CMakeCache.txt").is_file():
            if given:
                raise SystemExit(f"eredu: EREDU_BUILD_DIR={os.environ['EREDU_BUILD_DIR']} ({build}, from the "
                                 f"directory pip was run in) is not a configured CMake build")
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                            "-DEREDU_PYTHON=ON", "-DEREDU_BUILD_TESTS=OFF", "-DEREDU_BUILD_BENCH=OFF",
                            "-DEREDU_BUILD_EXAMPLES=OFF", "-DEREDU_BUILD_TOOLS=OFF",
                            f"-DPython3_EXECUTABLE={sys.executable}"], check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "eredu_python", "-j", str(os.cpu_count() or 1)],
                       check=True)
        # The extension for this interpreter's ABI: a reused build made for another one would
        # give a wheel whose tag promises what its extension does not load.
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = build / "python" / "eredu" / f"_native{suffix}"
        if not built.is_file():
            others = sorted(p.name for p in (build / "python" / "eredu").glob("_native*.so"))
            raise SystemExit(f"eredu: the build in {build} made no eredu/_native{suffix} for {sys.executable}"
                             + (f" (it has {', '.join(others)}: built for another interpreter)" if others else
                                " (is the Python module on there?)"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)


# setuptools' staging tree, fresh for each run rather than python/build: a file since removed from
# python/eredu cannot linger into a wheel, and two pip runs on one checkout do not share it.
_staging = tempfile.mkdtemp(prefix="eredu-setuptools-")
atexit.register(shutil.rmtree, _staging, ignore_errors=True)

setup(
    version=VERSION,
    packages=["eredu"],
    ext_modules=[CMakeExtension("eredu._native")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": _staging}, "egg_info": {"egg_base": _staging}},
    zip_safe=False,
)
