"""python3 -m ferry.launch --nproc-per-node N SCRIPT [ARGS...]: N processes of one machine, as torchrun starts
them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT in each one's environment,
read by `torch.distributed.init_process_group()`'s default env:// and by ferry.torch.DataParallel).

For the machines where torchrun cannot run: Debian's torch 1.13 under Python 3.11 stops in torchrun's own
start-up. The first process that fails ends the others (SIGTERM, then SIGKILL after `--grace` seconds), and
the launcher exits with its status (128 + the signal for one killed by a signal), as a shell would; Ctrl-C
reaches every process (one process group), and the launcher waits for them as it does at a failure. No
restarts, no rendezvous across machines: that is torchrun's.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional, Sequence


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(code: int) -> int:
    """A child's exit status as a shell reports it (Popen's -N for signal N)."""
    return 128 - code if code < 0 else code


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m ferry.launch", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", type=int, required=True,
                   help="processes to start (one per GPU on a GPU machine)")
    p.add_argument("--master-port", "--master_port", dest="port", type=int, default=None,
                   help="MASTER_PORT (default: a free port)")
    p.add_argument("--master-addr", "--master_addr", dest="addr", default="127.0.0.1", help="MASTER_ADDR")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds the others get to exit after one failed, before SIGKILL (default 10)")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module, run as python -m")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if not 1 <= a.nproc <= 1024:
        p.error(f"--nproc-per-node {a.nproc}: expected 1 to 1024 processes")
    if a.port is not None and not 1 <= a.port <= 65535:
        p.error(f"--master-port {a.port}: expected a port from 1 to 65535")
    if a.grace < 0:
        p.error(f"--grace {a.grace}: expected seconds >= 0")
    return a


def _end(procs: List[subprocess.Popen], grace: float) -> None:
    """SIGTERM to every process still running, SIGKILL to those left after `grace` seconds; reaps them."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class _Terminated(Exception):
    """The launcher got SIGTERM: its processes are ended before it exits."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    port = a.port if a.port is not None else _free_port()
    command = [sys.executable] + (["-m", a.script] if a.module else [a.script]) + list(a.args)
    procs: List[subprocess.Popen] = []
    try:
        for rank in range(a.nproc):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.nproc),
                       LOCAL_WORLD_SIZE=str(a.nproc), GROUP_RANK="0", MASTER_ADDR=a.addr, MASTER_PORT=str(port))
            try:
                procs.append(subprocess.Popen(command, env=env))
            except OSError as e:
                print(f"ferry.launch: cannot start {command[0]}: {e}", file=sys.stderr)
                _end(procs, a.grace)
                return 127
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(f"ferry.launch: rank {rank} exited with status {_status(code)}; ending the others",
                      file=sys.stderr)
                _end(procs, a.grace)
                return _status(code)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    except KeyboardInterrupt:
        # The processes got the same Ctrl-C (one process group): give them the grace to stop.
        _end(procs, a.grace)
        return 130
    except _Terminated:
        _end(procs, a.grace)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
