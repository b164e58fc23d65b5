"""python3 -m ferry.launch --nproc-per-node N SCRIPT [ARGS...]: N processes of one machine, as torchrun starts
them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT in each one's environment,
read by `torch.distributed.init_process_group()`'s default env:// and by ferry.torch.DataParallel).

For the machines where torchrun cannot run: Debian's torch 1.13 under Python 3.11 stops in torchrun's own
start-up. The first process that fails ends the others (SIGTERM, then SIGKILL after `--grace` seconds), and
the launcher exits with its status (128 + the signal for one killed by a signal), as a shell would; Ctrl-C
reaches every process (one process group), and the launcher waits for them as it does at a failure; a
second Ctrl-C (or a SIGTERM or SIGHUP then) kills them at once. SIGTERM or SIGHUP sent to the launcher
ends them the same way. A launcher killed by SIGKILL leaves them running. No restarts, no rendezvous
across machines: that is torchrun's.
"""
from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence, Tuple


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


class _Ranks:
    """The started processes, each waited for by a thread of its own, so that their exits are seen in the
    order they happen (one poll of every process could not tell which of two exits came first)."""

    def __init__(self) -> None:
        self.procs: List[subprocess.Popen] = []
        self.exits: "queue.Queue[Tuple[int, int]]" = queue.Queue()  # (rank, returncode), in exit order
        self._threads: List[threading.Thread] = []

    def start(self, command: List[str], env: dict) -> None:
        p = subprocess.Popen(command, env=env)
        rank = len(self.procs)
        self.procs.append(p)
        t = threading.Thread(target=lambda: self.exits.put((rank, p.wait())), daemon=True)
        t.start()
        self._threads.append(t)

    def running(self) -> List[subprocess.Popen]:
        return [p for p, t in zip(self.procs, self._threads) if t.is_alive()]

    def end(self, grace: float) -> None:
        """SIGTERM to every process still running, SIGKILL to those left after `grace` seconds or at a
        further SIGINT, SIGTERM or SIGHUP (a second Ctrl-C); returns once every process is reaped."""
        hurry = threading.Event()
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, lambda *_: hurry.set())
        try:
            for p in self.running():
                p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.running() and not hurry.is_set() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            for p in self.running():
                p.kill()
            for t in self._threads:
                t.join()


class _Terminated(Exception):
    """The launcher got SIGTERM or SIGHUP: its processes are ended before it exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_terminate(signum: int, frame: object) -> None:
    raise _Terminated(signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_terminate)
    port = a.port if a.port is not None else _free_port()
    command = [sys.executable] + (["-m", a.script] if a.module else [a.script]) + list(a.args)
    ranks = _Ranks()
    try:
        for rank in range(a.nproc):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.nproc),
                       LOCAL_WORLD_SIZE=str(a.nproc), GROUP_RANK="0", MASTER_ADDR=a.addr, MASTER_PORT=str(port))
            try:
                ranks.start(command, env)
            except OSError as e:
                print(f"ferry.launch: cannot start {command[0]}: {e}", file=sys.stderr)
                ranks.end(a.grace)
                return 127
        for _ in range(a.nproc):
            while True:
                try:  # a wait in slices, so that a signal's handler runs while the ranks run
                    rank, code = ranks.exits.get(timeout=0.5)
                    break
                except queue.Empty:
                    pass
            if code != 0:
                print(f"ferry.launch: rank {rank} exited with status {_status(code)}; ending the others",
                      file=sys.stderr)
                ranks.end(a.grace)
                return _status(code)
        return 0
    except KeyboardInterrupt:
        # The processes got the same Ctrl-C (one process group): give them the grace to stop.
        ranks.end(a.grace)
        return 128 + signal.SIGINT
    except _Terminated as t:
        ranks.end(a.grace)
        return 128 + t.signum


if __name__ == "__main__":
    sys.exit(main())
