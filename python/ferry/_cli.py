"""The `ferry` command of the installed package (a console script) and `python -m ferry`: both replace
this Python process with ferry's command-line tool (bundled next to libferry_c.so) given the same
arguments, so `ferry probe`, `ferry bench` and `ferry analyze` behave as the tool itself: its output, its
exit status, and Ctrl-C (the signal reaches the tool, which finishes what is in flight and exits 130)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, NoReturn, Optional

CLI_NAME = "ferry"
# The status `ferry` exits with when the tool cannot be run: the tool's own "the run failed".
EXIT_ERROR = 1


def cli_path() -> Optional[Path]:
    """The tool: the one bundled with the package, else the file FERRY_CLI names (a source checkout:
    build/<preset>/tools/ferry/ferry), else None."""
    bundled = Path(__file__).resolve().parent / CLI_NAME
    if bundled.is_file():
        return bundled
    env = os.environ.get("FERRY_CLI")
    if env and Path(env).is_file():
        return Path(env)
    return None


def _fail(message: str) -> NoReturn:
    print(f"ferry: error: {message}", file=sys.stderr)
    sys.exit(EXIT_ERROR)


def main(argv: Optional[List[str]] = None) -> NoReturn:
    """Runs the tool with `argv` (default: this process's arguments); never returns."""
    args = sys.argv[1:] if argv is None else list(argv)
    path = cli_path()
    if path is None:
        env = os.environ.get("FERRY_CLI")
        named = f"FERRY_CLI={env} is not a file" if env else "FERRY_CLI does not name one"
        _fail(f"ferry's command-line tool is not installed with this package (no {CLI_NAME} next to "
              f"{Path(__file__).resolve().parent / 'libferry_c.so'}) and {named}. Reinstall from ferry's "
              "source with `python3 -m pip install .` (it builds the tool with CMake), or build the "
              "ferry_cli target and set FERRY_CLI=build/<preset>/tools/ferry/ferry")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # argv[0] "ferry": the tool records its command line in JSON results as the user typed it.
        os.execv(path, [CLI_NAME, *args])
    except OSError as e:
        _fail(f"cannot run {path}: {e.strerror or e}")
