"""What every ferry object shares: the fork check and closing at interpreter exit.

ferry's objects own threads and device memory. A forked child inherits neither working threads nor a
usable CUDA context, so an object used in a child raises ForkedError (create it in the child, or start
DataLoader workers with the "spawn" or "forkserver" context). At interpreter exit every object still open
is closed (atexit runs before finalization, while ferry's threads may still call back into Python).
"""
from __future__ import annotations

import atexit
import os
import threading
import weakref

_pid = os.getpid()
_open: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_lock = threading.Lock()
_counter = 0


class ForkedError(RuntimeError):
    """A ferry object was used in a process forked after it was made."""


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pid() -> int:
    return _pid


def check_owner(obj, owner_pid: int) -> None:
    """Raises ForkedError when `obj` (made by process `owner_pid`) is used in another process."""
    if owner_pid != _pid:
        raise ForkedError(
            f"{type(obj).__name__} was made in process {owner_pid} and cannot be used in its forked child "
            f"{_pid}: ferry's threads and device state do not survive fork(); make it in the child, or use "
            "multiprocessing's 'spawn' or 'forkserver' context")


def register(obj) -> None:
    """Closes `obj` (its close() method) at interpreter exit if it is still alive."""
    global _counter
    with _lock:
        _counter += 1
        _open[_counter] = obj


@atexit.register
def _close_all() -> None:
    if _pid != os.getpid():
        return
    with _lock:
        objs = [o for _, o in sorted(_open.items(), reverse=True)]
    for o in objs:
        try:
            o.close()
        except BaseException as e:  # noqa: BLE001 - exit must go on; the error is still reported
            print(f"ferry: closing {type(o).__name__} at exit: {e}")
