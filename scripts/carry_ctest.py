#!/usr/bin/env python3
"""Writes the carry folder's CTestTestfile.cmake: the tests of a build (as tests/CMakeLists.txt declares
them, labels, filters and environment included) with this machine's paths made relative, so that
`ctest --test-dir .carry -L gpu` runs on the GPU machine, where the repository has another root and the
build folder does not exist.

Run by `scripts/gpu.sh carry` after it has stripped its binaries into the carry folder. Paths in a test are
rewritten as follows:
  - a file of the build that is carried (the carry folder has a file of its name): the carried file;
  - a file of the build that a gpu, multigpu or sanitizer test needs and that is not carried yet: stripped into the
    carry folder first (so the GPU machine never lacks a binary of a labelled test);
  - the build folder itself as a working directory: the carry folder;
  - the source tree: the repository root there (the carry folder's parent);
  - the program, when it is neither (python3, mpirun, cmake): looked up on that machine's PATH by name when
    ctest reads the file (FERRY_PYTHON3 overrides python3, as tests/CMakeLists.txt's variable of that name
    does here); a program not found there disables its tests, which ctest then lists as not run.
A cpu test that needs any other file of the build is left out and named on stdout.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

LABELLED_FOR_THE_GPU = {"gpu", "multigpu", "sanitizer"}
# Properties that describe where a test came from, not how it runs.
SKIPPED_PROPERTIES = {"_BACKTRACE_TRIPLES", "WORKING_DIRECTORY"}


def quote(text: str) -> str:
    """A CMake quoted argument of literal text (no variable references, no list separators)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace(";", "\\;")


class Rewriter:
    def __init__(self, build: Path, source: Path, carry: Path, strip: str):
        self.build, self.source, self.carry, self.strip = build, source, carry, strip
        self.programs: dict[str, str] = {}  # variable -> program name looked up on the GPU machine

    def carried(self, path: Path, need: bool) -> str | None:
        """The carried name of a build file, carrying it when `need`; None when it is not carried."""
        name = path.name
        if (self.carry / name).is_file():
            return name
        if not need or not path.is_file():
            return None
        # strip fails on files that are not objects (scripts, data); those are copied as they are.
        if subprocess.run([self.strip, "-o", str(self.carry / name), str(path)],
                          stderr=subprocess.DEVNULL).returncode != 0:
            shutil.copy2(path, self.carry / name)
        print(f"carried {path.relative_to(self.build)} (a gpu or multigpu test runs it)")
        return name

    def text(self, value: str, need: bool) -> str | None:
        """`value` as the inside of a CMake quoted argument with this machine's paths replaced; None when
        it names a file of the build that is not carried."""
        out, rest = "", value
        build, source = str(self.build), str(self.source)
        while rest:
            b, s = rest.find(build), rest.find(source)
            hits = [i for i in (b, s) if i >= 0]
            if not hits:
                out += quote(rest)
                break
            i = min(hits)
            out += quote(rest[:i])
            if i == b:  # the build folder first: it may lie inside the source tree
                # The path runs to the next separator of a list, an option or the end.
                end = len(rest)
                for sep in ("|", ";", " ", ":", ",", '"'):
                    j = rest.find(sep, i)
                    if j >= 0:
                        end = min(end, j)
                path = Path(rest[i:end])
                if path == self.build or path.is_dir():
                    out += "${carry}"
                else:
                    name = self.carried(path, need)
                    if name is None:
                        return None
                    out += "${carry}/" + quote(name)
                rest = rest[end:]
            else:
                out += "${root}"
                rest = rest[i + len(source):]
        return out

    def program(self, value: str, need: bool) -> str | None:
        p = Path(value)
        if not p.is_absolute() or str(p).startswith(str(self.build)) or str(p).startswith(str(self.source)):
            return self.text(value, need)
        var = "ferry_program_" + "".join(c if c.isalnum() else "_" for c in p.name)
        self.programs[var] = p.name
        return "${" + var + "}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, required=True, help="the configured and built build folder")
    ap.add_argument("--source", type=Path, required=True, help="the repository root")
    ap.add_argument("--carry", type=Path, required=True, help="the carry folder (binaries already in it)")
    ap.add_argument("--ctest", default=shutil.which("ctest") or "ctest")
    ap.add_argument("--strip", default="strip")
    args = ap.parse_args()
    build, source, carry = args.build.resolve(), args.source.resolve(), args.carry.resolve()
    shown = subprocess.run([args.ctest, "--test-dir", str(build), "--show-only=json-v1"], check=True,
                           capture_output=True, text=True).stdout
    tests = json.loads(shown)["tests"]
    rw = Rewriter(build, source, carry, args.strip)
    lines, left_out, problems = [], [], []
    for t in tests:
        name = t["name"]
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        need = bool(LABELLED_FOR_THE_GPU & set(labels))
        if not t.get("command"):
            (problems if need else left_out).append(f"{name} (its program is not built)")
            continue
        cmd = [rw.program(t["command"][0], need)] + [rw.text(a, need) for a in t["command"][1:]]
        body = [f'add_test("{quote(name)}" ' + " ".join(f'"{c}"' for c in cmd) + ")"] if None not in cmd else []
        prop_text = []
        for key, value in props.items():
            if key in SKIPPED_PROPERTIES:
                continue
            values = value if isinstance(value, list) else [value]
            parts = []
            for v in values:
                if isinstance(v, bool):
                    v = "TRUE" if v else "FALSE"
                elif isinstance(v, float) and v.is_integer():
                    v = str(int(v))
                parts.append(rw.text(str(v), need))
            if None in parts:
                body = []
                break
            prop_text.append(f'{key} "' + ";".join(parts) + '"')
        if not body:
            (problems if need else left_out).append(f"{name} (it needs a file of the build that is not carried)")
            continue
        wd = props.get("WORKING_DIRECTORY")
        if wd:
            wd_text = rw.text(wd, need)
            if wd_text is None or not wd_text.startswith(("${carry}", "${root}")):
                wd_text = "${carry}"
            prop_text.append(f'WORKING_DIRECTORY "{wd_text}"')
        body.append(f'set_tests_properties("{quote(name)}" PROPERTIES ' + " ".join(prop_text) + ")")
        disabled = [v for v in rw.programs if v in " ".join(body)]
        for v in disabled:
            body.append(f'if(NOT {v})\n  set_tests_properties("{quote(name)}" PROPERTIES DISABLED TRUE)\nendif()')
        lines.extend(body)
    if problems:
        for p in problems:
            print(f"carry_ctest: a gpu or multigpu test cannot be carried: {p}", file=sys.stderr)
        return 1
    head = [
        "# Generated by scripts/carry_ctest.py (scripts/gpu.sh carry) from the tests of the build; do not edit.",
        "# Run from anywhere: ctest --test-dir <this folder> -L gpu (or multigpu, sanitizer, cpu).",
        "# This folder (ctest reads the file from it) and the repository root, its parent.",
        '# scripts/gpu.sh sets FERRY_CARRY_DIR: on the GPU machine (ctest of CMake 4) the fallbacks left it empty.',
        'if(DEFINED ENV{FERRY_CARRY_DIR})\n  set(carry "$ENV{FERRY_CARRY_DIR}")\n'
        'elseif(CMAKE_CURRENT_LIST_DIR)\n  set(carry "${CMAKE_CURRENT_LIST_DIR}")\nelse()\n'
        '  file(REAL_PATH "." carry)\nendif()',
        'get_filename_component(root "${carry}/.." ABSOLUTE)',
        "# Programs of the machine that runs the tests, by name; a test whose program is missing is disabled.",
    ]
    for var, prog in sorted(rw.programs.items()):
        if prog == "python3":
            head.append(f'if(DEFINED ENV{{FERRY_PYTHON3}})\n  set({var} "$ENV{{FERRY_PYTHON3}}")\nelse()\n'
                        f'  find_program({var} NAMES python3)\nendif()')
        else:
            head.append(f"find_program({var} NAMES {prog})")
    out = carry / "CTestTestfile.cmake"
    out.write_text("\n".join(head + lines) + "\n", encoding="utf-8")
    kept = len(tests) - len(left_out)
    print(f"{out}: {kept} of {len(tests)} tests"
          + (f"; left out (cpu, their files are not carried): {', '.join(left_out)}" if left_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
