"""A Loader's worker processes seen from the main process: the start method, starting and stopping
them, and what is said about one that died, never started or is stuck (framework-neutral)."""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .worker import Fd, SampleFormat, worker_main

MAIN_GUARD_FIX = ("guard the script with `if __name__ == \"__main__\":`, define the dataset, transform and "
                  "worker_init_fn in an importable module, or pass start_method='fork' (Linux)")
_CRASHES = frozenset(int(getattr(signal, n)) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
                     if hasattr(signal, n))
_warned_start_method = False


class Worker:
    """A worker process, its pipes, the chunks it holds (id -> dispatch.Chunk, in the order sent) and its
    counters."""
    __slots__ = ("id", "pid", "process", "tasks", "results", "chunks", "samples", "bytes", "seconds",
                 "cpu_seconds", "write_seconds", "started")

    def __init__(self, wid: int, process: Any, tasks: Any, results: Any) -> None:
        self.id, self.process, self.tasks, self.results = wid, process, tasks, results
        self.pid: int = process.pid
        self.chunks: Dict[int, Any] = {}
        self.samples = self.bytes = 0
        self.seconds = self.cpu_seconds = self.write_seconds = 0.0
        self.started = False  # its ("ready",) was read: it got past unpickling and the main module's import


# ---- the start method ------------------------------------------------------------------------------------

def checked_start_method(asked: Optional[str]) -> None:
    """Refuses (ValueError) a start method that this platform does not have."""
    methods = multiprocessing.get_all_start_methods()
    if asked is not None and asked not in methods:
        raise ValueError(f"Loader(start_method={asked!r}): this platform has {', '.join(methods)}")


def _program_start_method() -> Optional[str]:
    """The start method the program chose with multiprocessing.set_start_method(), which a DataLoader
    without multiprocessing_context follows; None where it chose none, or Python's own default: that is
    also what multiprocessing fixes at the first use of its default context (every spawn or forkserver
    start asks for it), so it says nothing of the program's wish."""
    chosen = multiprocessing.get_start_method(allow_none=True)
    default = getattr(getattr(multiprocessing.context, "_default_context", None), "_default_context", None)
    return None if chosen is None or (default is not None and chosen == default.get_start_method()) else chosen


def start_method(asked: Optional[str]) -> str:
    """The start method of a Loader's workers: `asked`; else the one the program chose with
    multiprocessing.set_start_method(), as DataLoader; else fork, as DataLoader on Linux (also while
    other Python threads run: a worker runs only the dataset's Python code, never CUDA, and
    multiprocessing and logging renew their locks in a fork child), where fork is safe; elsewhere spawn,
    said once (a warning naming why, and start_method=)."""
    if asked is not None:
        checked_start_method(asked)
        return asked
    program = _program_start_method()
    if program is not None:
        return program
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and sys.platform != "darwin":
        return "fork"
    why = ("macOS's system libraries are not safe in a fork child; Python's default there is spawn"
           if "fork" in methods else "this platform cannot fork")
    global _warned_start_method
    if not _warned_start_method:
        _warned_start_method = True
        warnings.warn(f"ferry Loader: workers start with 'spawn', not 'fork' ({why}): each worker imports the main "
                      "module again and gets the dataset, transform and worker_init_fn pickled, so define them in an "
                      "importable module and guard the script with `if __name__ == \"__main__\":`; pass "
                      "start_method= to choose (and silence this)", RuntimeWarning, stacklevel=3)
    return "spawn"


def _preload_forkserver(modules: Sequence[str]) -> None:
    """A forkserver that the Loader starts imports `modules` (torch, the workers' modules) once, so that
    each worker is forked with them in place: without, every worker imports torch again (3.5-5 s each with
    torch 2.11 and CUDA's libraries, docs/PERFORMANCE.md). A forkserver already running is left as it is."""
    from multiprocessing import forkserver
    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is not None:
        return
    preload = list(getattr(server, "_preload_modules", ["__main__"]))
    forkserver.set_forkserver_preload(preload + [m for m in (*modules, __name__) if m not in preload])


# ---- starting and stopping --------------------------------------------------------------------------------

def start_workers(count: int, method: str, seed: int, dataset: Any, transform: Any, worker_init_fn: Any,
                  fmt: SampleFormat, memfd: int, preload: Sequence[str], workers: List[Worker]) -> None:
    """Starts `count` workers into `workers` (appended as each starts, so that a failure part-way leaves
    the started ones for stop_workers)."""
    if method != "fork" and getattr(multiprocessing.current_process(), "_inheriting", False):
        # multiprocessing's mark of a spawned process importing the main module, where it refuses to
        # start another (the script's body reruns in each worker).
        raise RuntimeError("ferry Loader: made while this process starts as a worker of a spawn or forkserver "
                           "start method and imports the main module again: the main module makes a Loader "
                           "outside `if __name__ == \"__main__\":`; put the script's code under it")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        _preload_forkserver(preload)
    # The parent-death signal follows the thread that forked: only the main thread lives as long as
    # the process. From another thread, or under a forkserver, a worker finds out by EOF instead.
    on_main = threading.current_thread() is threading.main_thread()
    parent = os.getpid() if on_main and method != "forkserver" else None
    collect = gc.isenabled()
    for wid in range(count):
        task_r, task_w = ctx.Pipe(duplex=False)
        result_r, result_w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=worker_main, name=f"ferry-loader-{wid}", daemon=True,
                        args=(wid, count, seed, dataset, transform, worker_init_fn, fmt, Fd(memfd), task_r, result_w,
                              parent, collect))
        try:
            with warnings.catch_warnings():
                # Python 3.12 warns that fork() in a threaded process may deadlock the child; the
                # worker only runs Python and the dataset (as a DataLoader's forked workers do).
                warnings.simplefilter("ignore", DeprecationWarning)
                gc.disable()  # until the worker has frozen what it inherited (worker.py)
                try:
                    p.start()
                finally:
                    if collect:
                        gc.enable()
        except BaseException as e:
            for end in (task_r, task_w, result_r, result_w):
                end.close()
            if isinstance(e, Exception):
                raise _start_failed(wid, count, method, e) from e
            raise
        task_r.close()  # the child's ends: EOF on the results pipe then means the worker died
        result_w.close()
        workers.append(Worker(wid, p, task_w, result_r))


def _start_failed(wid: int, count: int, method: str, e: Exception) -> RuntimeError:
    what = f"ferry Loader: worker {wid} of {count} could not be started ({type(e).__name__}: {e})"
    if method != "fork" and isinstance(e, (pickle.PicklingError, AttributeError, TypeError)):
        return RuntimeError(f"{what}: under start_method={method!r} the dataset, transform and "
                            "worker_init_fn are pickled to each worker: define them at the top level of an "
                            "importable module (not inside a function, `python -c` or a notebook), or pass "
                            "start_method='fork' (Linux)")
    if isinstance(e, OSError):
        return RuntimeError(f"{what}: the system refused another process; lower workers= (now "
                            f"{count}), or workers=0 to make the samples in this process")
    return RuntimeError(f"{what}; start_method={method!r}: another start method may work "
                        "(start_method='fork', 'spawn' or 'forkserver'), or workers=0 to make the samples in "
                        "this process")


def stop_workers(workers: Iterable[Worker]) -> None:
    """Asks each worker to exit, SIGKILLs any that has not within a second, closes their pipes."""
    workers = list(workers)
    for w in workers:
        try:
            w.tasks.send(None)
        except (OSError, ValueError):
            pass
        w.tasks.close()
    deadline = time.monotonic() + 1.0
    for w in workers:
        w.process.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.process.is_alive():
            w.process.kill()
            w.process.join(1.0)
        w.results.close()
        try:
            w.process.close()  # its sentinel descriptor
        except ValueError:
            pass  # still running after SIGKILL and a second: the kernel reaps it; its pid stays in stats()


# ---- what is said about a worker -------------------------------------------------------------------------

def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return str(number)


def worker_died(w: Worker, holding: str, method: Optional[str]) -> RuntimeError:
    """The error of a worker found dead: how it ended (status or signal), what it held, a hint."""
    w.process.join(0.05)
    code = w.process.exitcode
    hint = ""
    if code is None:
        how = "is still running but closed its pipe"
    elif code < 0:
        how = f"was killed by signal {signal_name(-code)}"
        if -code == signal.SIGKILL:
            hint = ("; SIGKILL is often the kernel's out-of-memory killer (dmesg says): lower workers= or "
                    "what each worker holds")
        elif -code in _CRASHES:
            hint = "; a crash, in native code the dataset ran: the worker's Python stack is on stderr"
    else:
        how = f"exited with status {code}"
        hint = "; its error, if any, is on stderr (a dataset that calls sys.exit() or os._exit() ends its worker)"
    if not w.started:
        how += " while starting"
        if method != "fork" and code is not None and code > 0:
            hint = (f"; its error is on stderr. Under start_method={method!r} a worker imports the "
                    "main module again and unpickles the dataset (a Dataset defined in `python -c` or a "
                    f"notebook cannot be): {MAIN_GUARD_FIX}")
    held = f" {holding}" if holding else ""
    return RuntimeError(f"ferry Loader worker {w.id} (pid {w.pid}) {how}{held}; the loader is closed{hint}")


def not_started(workers: Iterable[Worker], method: Optional[str]) -> str:
    """What to do about those of `workers` that never started (sent nothing, not even "ready", since
    they were started), said where one holds up the loader at the timeout: under spawn and forkserver
    such a worker is still importing the main module, or blocked in it (a script whose top level runs
    torch.distributed.init_process_group() blocks there, waiting for ranks that never come); "" if
    every one of them started."""
    late = [w for w in workers if not w.started and not w.results.poll()]  # a first message is "ready"
    if not late:
        return ""
    who = (f"worker {late[0].id} never started" if len(late) == 1
           else f"workers {', '.join(str(w.id) for w in late)} never started")
    if method == "fork":
        return f"; {who} (nothing came from it since the fork)"
    return (f"; {who}: under start_method={method!r} a worker first imports the main module again "
            "and unpickles the dataset, so a script's top-level code runs in it (there, a "
            "torch.distributed.init_process_group() outside the main guard waits for ranks that never come): "
            f"{MAIN_GUARD_FIX}; a worker merely slow to import needs a larger timeout=")


def ask_for_stack(pid: int) -> str:
    """Asks a worker for its Python stack (SIGUSR1: faulthandler prints it to the worker's stderr) and
    says its scheduler state from /proc ("R" running, "S" sleeping, "D" in the kernel...) and where the
    stack is: "state S, its Python stack on stderr"; "gone" for a worker that exited. Only a worker that
    catches SIGUSR1 is asked: one still starting (before faulthandler is registered) would be killed by it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        state = fields["State"].split()[0]
        if not int(fields["SigCgt"], 16) >> (signal.SIGUSR1 - 1) & 1:
            return f"state {state}, still starting: no stack"
        os.kill(pid, signal.SIGUSR1)
        return f"state {state}, its Python stack on stderr"
    except (OSError, KeyError, IndexError, ValueError):
        return "gone"
