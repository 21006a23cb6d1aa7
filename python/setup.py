"""pip's entry to the `eredu` module: the extension eredu._native is built by the project's CMake
(the same target `cmake --build` builds, linking eredu's static libraries), then packaged with
the pure-Python files of python/eredu.

    python3 -m pip install --no-build-isolation ./python            # configures and builds build/python-package
    EREDU_BUILD_DIR=build/release python3 -m pip install --no-build-isolation ./python   # reuses a build

The build is for the interpreter running pip (-DPython3_EXECUTABLE=sys.executable).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VERSION = re.search(r"project\(eredu VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text()).group(1)


class CMakeExtension(Extension):
    """An extension whose sources CMake knows: setuptools only gets the built file."""

    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures (once) and builds the eredu_python target, then copies _native*.so where setuptools wants it."""

    def build_extension(self, ext):
        given = os.environ.get("EREDU_BUILD_DIR")
        build = Path(given).resolve() if given else ROOT / "build" / "python-package"
        if not (build / "CMakeCache.txt").is_file():
            if given:
                raise SystemExit(f"eredu: EREDU_BUILD_DIR={given} is not a configured CMake build")
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                            "-DEREDU_PYTHON=ON", "-DEREDU_BUILD_TESTS=OFF", "-DEREDU_BUILD_BENCH=OFF",
                            "-DEREDU_BUILD_EXAMPLES=OFF", "-DEREDU_BUILD_TOOLS=OFF",
                            f"-DPython3_EXECUTABLE={sys.executable}"], check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "eredu_python", "-j", str(os.cpu_count() or 1)],
                       check=True)
        built = sorted((build / "python" / "eredu").glob("_native*.so"))
        if not built:
            raise SystemExit(f"eredu: the build in {build} made no eredu/_native*.so (is the Python module on there?)")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


setup(
    version=VERSION,
    packages=["eredu"],
    ext_modules=[CMakeExtension("eredu._native")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
