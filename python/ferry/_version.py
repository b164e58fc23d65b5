"""ferry's version, PEP 440: the CMake project version, `project(ferry VERSION x.y.z)` in CMakeLists.txt,
its one source. setup.py reads it through this file for the distribution's metadata (what `pip show
ferry-gpu` prints) and writes it as a literal into the installed copy of this file; in a source checkout
it is read from CMakeLists.txt here. The library and the CLI carry the same version with the build's
commit as a PEP 440 local label (`ferry --version`: ferry 0.1.0+g1a2b3c4), cmake/ferry_version.cmake."""
from __future__ import annotations

import re
from pathlib import Path

PROJECT_VERSION = re.compile(r"^project\(\s*ferry\s+VERSION\s+(\d+(?:\.\d+)*)\b", re.M)


def version_of(cmake_lists: Path) -> str:
    """The project version that `cmake_lists` (ferry's top-level CMakeLists.txt) declares."""
    m = PROJECT_VERSION.search(cmake_lists.read_text())
    if m is None:
        raise RuntimeError(f"ferry: no `project(ferry VERSION x.y.z)` in {cmake_lists}")
    return m.group(1)


__version__ = version_of(Path(__file__).resolve().parents[2] / "CMakeLists.txt")
