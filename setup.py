"""Builds libferry_c.so and the `ferry` command-line tool with CMake and puts both inside the `ferry`
package of the distribution `ferry-gpu` (pyproject.toml has the rest).

Environment:
  FERRY_PREBUILT_LIBRARY=path/to/libferry_c.so and FERRY_PREBUILT_CLI=path/to/ferry (both, or neither)
      skip the build and package these files instead (build/<preset>/src/c/libferry_c.so and
      build/<preset>/tools/ferry/ferry of a CMake build).
  FERRY_PREBUILT_INJECT=path/to/libferry_inject.so: `ferry trace`'s injection library to package (default:
      src/inject/libferry_inject.so of the build FERRY_PREBUILT_LIBRARY comes from).
  FERRY_CMAKE_ARGS adds arguments to the CMake configure step (for example -DFERRY_WITH_CUDA=OFF).
  FERRY_JOBS: parallel build jobs (default: every core).
  FERRY_REQUIRE_CUDA=1 fails the install when the library would be built without the cuda backend (no
      nvcc found) instead of installing a host-only library with a warning.

The version is the CMake project version (python/ferry/_version.py reads it from CMakeLists.txt).
"""
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
VERSION = runpy.run_path(str(ROOT / "python" / "ferry" / "_version.py"))["__version__"]
LIBRARY = "libferry_c.so"
INJECT = "libferry_inject.so"  # `ferry trace`'s injection library (src/inject)
CLI = "ferry"
# What a library built without the CUDA toolkit says when asked for a GPU (src/cuda/no_cuda.cpp; the
# same text as python/ferry/_device.py's NO_CUDA_MARK, which tests/python/test_package.py checks).
NO_CUDA_MARK = b"built without the CUDA toolkit"
TTY = "/dev/tty"


def cache_entries(build: Path) -> dict:
    """The CMake cache of `build` as {name: value} (types dropped); {} before the first configure."""
    entries = {}
    cache = build / "CMakeCache.txt"
    if cache.is_file():
        for line in cache.read_text().splitlines():
            if line and not line.startswith(("#", "//")) and "=" in line and ":" in line.split("=", 1)[0]:
                key, value = line.split("=", 1)
                entries[key.split(":", 1)[0]] = value
    return entries


def host_only_reason(entries: dict, configure_output: str):
    """Why a configured build has no cuda backend, or None when it has one: "asked" when the build was
    configured with FERRY_WITH_CUDA=OFF (a cached option), "no nvcc" when CMakeLists.txt reported the
    backend off (its `ferry: cuda backend OFF` status line; the compiler CMakeLists.txt names itself is
    not cached, so the cache cannot tell)."""
    if entries.get("FERRY_WITH_CUDA", "ON").upper() in ("OFF", "0", "FALSE", "NO", "N"):
        return "asked"
    if re.search(r"^-- ferry: cuda backend OFF\b", configure_output, re.M):
        return "no nvcc"
    return None


def host_only_message(prebuilt: bool, required: bool) -> str:
    cause = ("the prebuilt library (FERRY_PREBUILT_LIBRARY) was built without the CUDA toolkit" if prebuilt
             else "no CUDA compiler (nvcc) was found on this machine")
    if required:
        head = (f"ferry-gpu: error: FERRY_REQUIRE_CUDA=1, but {cause}: ferry would be installed without its "
                "cuda backend. ")
    else:
        head = (f"ferry-gpu: WARNING: {cause}, so ferry is installed WITHOUT its cuda backend: only the "
                "emulated host device works (ferry.Device(\"cuda\") and `ferry probe --backend cuda` are "
                "refused). ")
    return head + (
        "To drive a GPU, install the CUDA toolkit (nvcc on the PATH, or /usr/local/cuda/bin/nvcc) and "
        "reinstall: FERRY_REQUIRE_CUDA=1 python3 -m pip install --force-reinstall --no-deps . "
        "(FERRY_REQUIRE_CUDA=1 fails an install without nvcc instead of warning; "
        "FERRY_CMAKE_ARGS=-DFERRY_WITH_CUDA=OFF builds host-only without this warning.)")


def shout(message: str) -> None:
    """Writes `message` where a user sees it even under `pip install -q`, which hides everything a build
    prints unless it fails: the terminal (/dev/tty, when there is one) and stderr (in pip's log, and on the
    screen with `pip install -v`)."""
    text = "\n" + message + "\n\n"
    try:
        with open(TTY, "w") as tty:
            tty.write(text)
    except OSError:
        pass  # no controlling terminal (CI): stderr, and FERRY_REQUIRE_CUDA=1 to fail instead
    sys.stderr.write(text)
    sys.stderr.flush()


def check_cuda(reason, prebuilt: bool) -> None:
    """Fails (FERRY_REQUIRE_CUDA=1) or warns when the library has no cuda backend for lack of nvcc."""
    if reason is None:
        return
    required = os.environ.get("FERRY_REQUIRE_CUDA", "0") not in ("", "0")
    if reason == "asked":
        if required:
            raise SystemExit("ferry-gpu: FERRY_REQUIRE_CUDA=1 contradicts FERRY_WITH_CUDA=OFF in the CMake "
                             "arguments (FERRY_CMAKE_ARGS); drop one of them")
        sys.stderr.write("ferry-gpu: building the host backend only (FERRY_WITH_CUDA=OFF)\n")
        return
    if required:
        raise SystemExit(host_only_message(prebuilt, required=True))
    shout(host_only_message(prebuilt, required=False))


def cmake_build() -> tuple:
    """Configures and builds libferry_c.so and the tool in build/python; their paths."""
    build = ROOT / "build" / "python"
    configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 "-DFERRY_BUILD_TESTS=OFF", "-DFERRY_BUILD_TOOLS=ON", "-DFERRY_BUILD_C_API=ON"]
    if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    if cache_entries(build).get("CMAKE_CUDA_COMPILER", "").endswith("NOTFOUND"):
        # A failed search is cached; search again, so a reinstall after installing CUDA finds nvcc.
        configure += ["-UCMAKE_CUDA_COMPILER"]
    configure += shlex.split(os.environ.get("FERRY_CMAKE_ARGS", ""))
    configured = subprocess.run(configure, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(configured.stdout)
    if configured.returncode != 0:
        raise SystemExit(f"ferry-gpu: CMake's configure step failed (exit status {configured.returncode})")
    check_cuda(host_only_reason(cache_entries(build), configured.stdout), prebuilt=False)  # before the build
    jobs = os.environ.get("FERRY_JOBS", str(os.cpu_count() or 2))
    subprocess.check_call(["cmake", "--build", str(build), "--target", "ferry_c", "ferry_cli", "ferry_inject", "-j",
                           jobs])
    return build / "src" / "c" / LIBRARY, build / "tools" / "ferry" / CLI


def prebuilt():
    """The files FERRY_PREBUILT_LIBRARY and FERRY_PREBUILT_CLI name, or None when neither is set."""
    library, cli = os.environ.get("FERRY_PREBUILT_LIBRARY"), os.environ.get("FERRY_PREBUILT_CLI")
    if not library and not cli:
        return None
    if not library or not cli:
        given, missing = ("FERRY_PREBUILT_LIBRARY", "FERRY_PREBUILT_CLI") if library else \
            ("FERRY_PREBUILT_CLI", "FERRY_PREBUILT_LIBRARY")
        raise SystemExit(f"ferry-gpu: {given} is set but {missing} is not: name both (build/<preset>/src/c/"
                         f"{LIBRARY} and build/<preset>/tools/ferry/{CLI}), or neither to build both with CMake")
    for name, path in (("FERRY_PREBUILT_LIBRARY", library), ("FERRY_PREBUILT_CLI", cli)):
        if not Path(path).is_file():
            raise SystemExit(f"ferry-gpu: {name}={path} is not a file")
    if not os.access(cli, os.X_OK):
        raise SystemExit(f"ferry-gpu: FERRY_PREBUILT_CLI={cli} is not executable")
    host_only = NO_CUDA_MARK in Path(library).read_bytes()
    check_cuda("no nvcc" if host_only else None, prebuilt=True)
    return Path(library), Path(cli)


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        library, cli = prebuilt() or cmake_build()
        package = Path(self.build_lib) / "ferry"
        package.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, package / LIBRARY)
        shutil.copy2(cli, package / CLI)  # run by the `ferry` command and `python -m ferry` (ferry/_cli.py)
        (package / CLI).chmod(0o755)
        # `ferry trace`'s injection library, which the tool looks for beside itself: FERRY_PREBUILT_INJECT,
        # else the one the same build made (build/<preset>/src/inject/).
        inject = Path(os.environ.get("FERRY_PREBUILT_INJECT") or Path(library).parent.parent / "inject" / INJECT)
        if inject.is_file():
            shutil.copy2(inject, package / INJECT)
        else:
            shout(f"ferry-gpu: {inject} is missing: `ferry trace` will not work from this install "
                  "(build the ferry_inject target, or set FERRY_PREBUILT_INJECT)")
        # The installed package carries its version as a literal (a source checkout reads CMakeLists.txt).
        (package / "_version.py").write_text(
            f'"""ferry\'s version, PEP 440: the CMake project version it was built from."""\n'
            f'__version__ = "{VERSION}"\n')


class BinaryDistribution(Distribution):
    """The wheel holds a shared library, so it is tagged for this platform."""

    def has_ext_modules(self):
        return True


if __name__ == "__main__":  # as pip's build backend runs it; tests/python/test_package.py imports the rest
    setup(version=VERSION, cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
