#!/usr/bin/env python3
"""ferry's layering check (docs/ARCHITECTURE.md): one folder is one target, and a target includes only
the targets below it. Run by CI (ctest `layers`); exits 1 and names every offending line.

Rules:
  1. A file of target T (src/T/**, include/ferry/T/**, tests/T/**) includes "ferry/U/..." only when U is T
     or a target T depends on (LAYERS below, which mirrors the CMake targets' links).
  2. The host-only targets never include a CUDA, CUPTI, NVML, NCCL or cuBLAS header, nor ferry's own
     CUDA-only headers (include/ferry/cuda/detail/, include/ferry/cupti/).
  3. Backend-specific code of a component lives under that component: nothing in src/cuda/ includes
     ferry/probe, ferry/ingest, ferry/egress or ferry/comm (rule 1 already forbids it; it is named here
     because it is the mistake this layout exists to prevent).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# Each target and the targets it may use directly; uses are transitive (closure below).
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "trace": {"core"},
    "analyze": {"trace"},
    "report": {"analyze"},
    "device": {"trace"},
    "shim": {"core"},
    "cupti": {"trace", "shim"},
    "cuda": {"device", "shim", "cupti"},
    "probe": {"device", "cuda", "shim"},
    "ingest": {"device"},
    "egress": {"device"},
    "comm": {"device", "shim", "cuda"},
    "image": {"device", "shim", "cuda"},
    "bench": {"ingest", "egress", "comm", "probe", "analyze", "report", "cuda"},
    "c": {"ingest", "egress", "comm", "image", "probe", "analyze", "report", "cuda"},
    "inject": {"trace", "shim", "cupti"},
    "launch": {"trace"},
}
# Targets that must build without the CUDA toolkit (docs/ARCHITECTURE.md: host-only layers).
HOST_ONLY = {"core", "trace", "analyze", "report", "device", "ingest", "egress", "launch"}
# Folders that are not a target's but may use any of them.
TOP = {"tools", "examples"}
# Test folders that are not named after a target, and the target they test.
# tests/device runs its conformance suite on every backend, so it is checked as the cuda target's.
TEST_FOLDERS = {"support": "cuda", "fuzz": "analyze", "layers": None, "compile_fail": "device",
                "device": "cuda", "real_traces": "analyze"}

CUDA_HEADER = re.compile(r"^(cuda[_a-z0-9]*|cupti[_a-z0-9]*|nvml|nccl|cublas[_a-zA-Z0-9]*|"
                         r"cuda/.*|nvrtc|cufile)\.h(pp)?$|^ferry/cuda/detail/|^ferry/cupti/")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
SOURCES = {".hpp", ".h", ".cpp", ".cc", ".cu", ".cuh", ".inc"}


def closure(layers: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}

    def visit(t: str, seen: tuple[str, ...]) -> set[str]:
        if t in out:
            return out[t]
        if t in seen:
            raise SystemExit(f"layers: cycle {' -> '.join(seen + (t,))}")
        deps = set()
        for d in layers[t]:
            deps |= {d} | visit(d, seen + (t,))
        out[t] = deps
        return deps

    for t in layers:
        visit(t, ())
    return out


def target_of(rel: Path) -> str | None:
    """The target a file belongs to, 'top' for tools and examples, None when unchecked."""
    parts = rel.parts
    if len(parts) >= 3 and parts[0] == "include" and parts[1] == "ferry":
        return parts[2] if parts[2] in LAYERS else None
    if len(parts) >= 2 and parts[0] == "src":
        return parts[1] if parts[1] in LAYERS else None
    if len(parts) >= 2 and parts[0] == "tests":
        if parts[1] in TEST_FOLDERS:
            return TEST_FOLDERS[parts[1]]
        return parts[1] if parts[1] in LAYERS else None
    if parts and parts[0] in TOP:
        return "top"
    return None


def check(root: Path) -> list[str]:
    allowed = closure(LAYERS)
    problems: list[str] = []
    for folder in ("include", "src", "tests", "tools", "examples"):
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            rel = path.relative_to(root)
            target = target_of(rel)
            if target is None or target == "top":
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for lineno, line in enumerate(text.splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                header = m.group(1)
                where = f"{rel}:{lineno}"
                if target in HOST_ONLY and CUDA_HEADER.search(header):
                    problems.append(f"{where}: {target} is host-only but includes <{header}> "
                                    "(CUDA code belongs in the cuda target or a component's *_cuda file)")
                    continue
                hm = re.match(r"^ferry/([a-z_]+)/", header)
                if not hm or hm.group(1) not in LAYERS:
                    continue
                used = hm.group(1)
                if used != target and used not in allowed[target]:
                    ok = ", ".join(sorted(allowed[target]))
                    may = f"may use only {ok}" if ok else "uses no other ferry target"
                    problems.append(f"{where}: {target} includes \"{header}\", but {target} {may} "
                                    "(docs/ARCHITECTURE.md)")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the repository to check (default: this one)")
    args = parser.parse_args()
    problems = check(args.root)
    for p in problems:
        print(p, flush=True)
    if problems:
        print(f"layers: {len(problems)} include(s) break the layering", file=sys.stderr)
        return 1
    print(f"layers: ok ({len(LAYERS)} targets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
