#!/usr/bin/env python3
"""scripts/gpu.sh without a GPU (ctest `gpu_sh`): it parses (bash -n); --help and `list` name every workload
of its table; each workload's every mode resolves, and its dry run lists steps and a summary; a wrong
subcommand, mode or count of arguments exits 2; each removed subcommand names what replaces it; every
summary of scripts/gpu_summary.py reads an empty run without failing; and the documentation outside the
run notes (docs/perf/) and the scripts name no removed subcommand, nor a mode of another workload. Exits 1 naming each failure."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_SH = ROOT / "scripts" / "gpu.sh"
failures: list[str] = []


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(GPU_SH), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60)


def check(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)


def workloads() -> dict[str, list[str]]:
    """name -> modes, from the script's own table (WORKLOADS=( "name|modes|what" ... ))."""
    text = GPU_SH.read_text()
    table = text[text.index("WORKLOADS=(") : text.index("\n)", text.index("WORKLOADS=("))]
    return {m[1]: m[2].split() for m in re.finditer(r'^\s*"([a-z-]+)\|([a-z_0-9 ]+)\|', table, re.M)}


def main() -> int:
    table = workloads()
    check(len(table) >= 5, f"gpu.sh's WORKLOADS table has {len(table)} rows")
    r = subprocess.run(["bash", "-n", str(GPU_SH)], capture_output=True, text=True)
    check(r.returncode == 0, f"bash -n scripts/gpu.sh: {r.stderr}")

    help_text = run("--help")
    listing = run("list")
    check(help_text.returncode == 0 and listing.returncode == 0, "--help or list exited nonzero")
    for name, modes in table.items():
        for out, what in ((help_text.stdout, "--help"), (listing.stdout, "list")):
            check(re.search(rf"^  {re.escape(name)} +\[{re.escape('|'.join(modes))}\]$", out, re.M) is not None,
                  f"{what} does not list workload {name} [{'|'.join(modes)}]")
        for mode in [None, *modes]:
            args = [name] + ([mode] if mode else [])
            r = run("--dry-run", *args)
            steps = [x for x in r.stdout.splitlines() if re.match(r"^[A-Za-z0-9_.-]+: ", x) and not x.startswith("summary:")]
            check(r.returncode == 0, f"gpu.sh -n {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
            check(bool(steps), f"gpu.sh -n {' '.join(args)} lists no step")
            check(any(x.startswith("summary: python3 scripts/gpu_summary.py ") for x in r.stdout.splitlines()),
                  f"gpu.sh -n {' '.join(args)} lists no summary")
        r = run(name, "no-such-mode")
        check(r.returncode == 2 and "unknown mode" in r.stderr, f"gpu.sh {name} no-such-mode: exit {r.returncode}")
        r = run(name, modes[0], "extra")
        check(r.returncode == 2, f"gpu.sh {name} {modes[0]} extra: exit {r.returncode}")

    r = run("-n", "tests")
    check(r.returncode == 0 and "-L ^gpu$" in r.stdout.replace("\\", ""), f"gpu.sh -n tests: {r.stdout!r}")
    r = run("-n", "tests", "multigpu", "-R", "^comm_nccl$")
    check("-L ^multigpu$ -R ^comm_nccl$" in r.stdout.replace("\\", ""), f"gpu.sh -n tests multigpu -R ...: {r.stdout!r}")
    r = run("no-such-subcommand")
    check(r.returncode == 2 and "unknown subcommand" in r.stderr, f"gpu.sh no-such-subcommand: exit {r.returncode}")
    for old in ("check", "verify", "trace-check", "trace-inject", "comm-tests", "one-gpu-comm", "dp", "loader tests"):
        r = run(*old.split())
        check(r.returncode == 2 and "was removed; instead:" in r.stderr, f"gpu.sh {old}: {r.stderr.strip()!r}")
    r = run("trace-cost", env={"PATH": "/usr/bin:/bin", "TRACE_VARIANTS": "traced no-such-variant"})
    check(r.returncode == 2 and "unknown variant" in r.stderr, f"TRACE_VARIANTS=no-such-variant: {r.stderr.strip()!r}")

    # Each summary over an empty run folder: it names what is missing, and exits 0.
    text = GPU_SH.read_text()
    kinds = set(re.findall(r"^\s*finish ([a-z-]+)", text, re.M))
    with tempfile.TemporaryDirectory() as d:
        for kind in sorted(kinds):
            args = [kind, "24"] if kind == "tails" else [kind]
            r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_summary.py"), *args, d],
                               capture_output=True, text=True, timeout=60)
            check(r.returncode == 0, f"gpu_summary.py {kind} over an empty run: exit {r.returncode}: {r.stderr[-300:]}")

    # Subcommands named by the documentation (outside the run notes, which keep history) and the scripts.
    removed = set(re.findall(r'^\s*"([a-z-]+)[ |]', text[text.index("REMOVED=(") :], re.M)) - set(table)
    modes = {m for ms in table.values() for m in ms} | {"tests"}
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scripts").glob("*")),
             *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "examples").rglob("*.py"))]
    for f in files:
        if not f.is_file() or f in (GPU_SH, Path(__file__).resolve()) or f.suffix not in {".md", ".py", ".sh", ""}:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in re.finditer(r"gpu\.sh ([a-z][a-z0-9-]*)(?: ([a-z_0-9]+))?", line):
                sub, mode = m[1], m[2]
                where = f"{f.relative_to(ROOT)}:{n}"
                if sub in removed:
                    failures.append(f"{where} names gpu.sh {sub}, a removed subcommand")
                elif sub in table and mode in modes and mode not in table[sub]:
                    failures.append(f"{where} names gpu.sh {sub} {mode}, which is no mode")
    for f in failures:
        print(f"gpu_sh: {f}")
    print(f"gpu_sh: {len(table)} workloads checked; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
