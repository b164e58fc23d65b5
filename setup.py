"""Builds libferry_c.so with CMake and puts it inside the `ferry` package (pyproject.toml has the rest).

FERRY_PREBUILT_LIBRARY=path/to/libferry_c.so skips the build and packages that library instead.
FERRY_CMAKE_ARGS adds arguments to the CMake configure step (for example -DFERRY_WITH_CUDA=OFF).
"""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        prebuilt = os.environ.get("FERRY_PREBUILT_LIBRARY")
        if prebuilt:
            library = Path(prebuilt)
        else:
            build = ROOT / "build" / "python"
            configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                         "-DFERRY_BUILD_TESTS=OFF", "-DFERRY_BUILD_TOOLS=OFF", "-DFERRY_BUILD_C_API=ON"]
            if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
                configure += ["-G", "Ninja"]
            configure += shlex.split(os.environ.get("FERRY_CMAKE_ARGS", ""))
            subprocess.check_call(configure)
            jobs = os.environ.get("FERRY_JOBS", str(os.cpu_count() or 2))
            subprocess.check_call(["cmake", "--build", str(build), "--target", "ferry_c", "-j", jobs])
            library = build / "src" / "c" / "libferry_c.so"
        target = Path(self.build_lib) / "ferry" / "libferry_c.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, target)


class BinaryDistribution(Distribution):
    """The wheel holds a shared library, so it is tagged for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
