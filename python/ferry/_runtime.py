"""What every ferry object shares: the fork check, waits that Ctrl-C can interrupt, and closing at
interpreter exit.

ferry's objects own threads and device memory. A forked child inherits neither working threads nor a
usable CUDA context, so an object used in a child raises ForkedError (create it in the child, or start
DataLoader workers with the "spawn" or "forkserver" context).

Exit. One atexit function closes every object still open, newest first, while the interpreter is whole:
atexit runs before modules are torn down, so ferry's threads may still call back into Python, and a
Prefetcher is closed before the device and the stream its lent batches are released on go with their
modules (a batch still referenced by a global is then freed last, on a closed prefetcher, which has
nothing to refill).
"""
from __future__ import annotations

import _thread
import atexit
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, List, Optional

_pid = os.getpid()
_open: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_lock = threading.Lock()
_counter = 0
_exiting = False


class ForkedError(RuntimeError):
    """A ferry object was used in a process forked after it was made."""


def _after_fork_in_child() -> None:
    global _pid, _lock
    _pid = os.getpid()
    # The objects open at the fork are the parent's: the child's exit closes none of them (their close()
    # refuses in a forked child, so each would print an error at its exit). The lock may have been held by
    # another of the parent's threads at the fork: the child's is new.
    _lock = threading.Lock()
    _open.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pid() -> int:
    return _pid


def check_owner(obj: Any, owner_pid: int) -> None:
    """Raises ForkedError when `obj` (made by process `owner_pid`) is used in another process."""
    if owner_pid != _pid:
        raise ForkedError(
            f"{type(obj).__name__} was made in process {owner_pid} and cannot be used in its forked child "
            f"{_pid}: ferry's threads and device state do not survive fork(); make it in the child, or use "
            "multiprocessing's 'spawn' or 'forkserver' context")


def register(obj: Any) -> None:
    """Closes `obj` (its close() method) at interpreter exit if it is still alive."""
    global _counter
    with _lock:
        _counter += 1
        _open[_counter] = obj


def exiting() -> bool:
    """True once the interpreter runs its exit functions (ferry's objects are being closed)."""
    return _exiting


def exiting_on_interrupt() -> bool:
    """True at exit after an uncaught KeyboardInterrupt (the interpreter keeps the exception it printed
    in sys.last_value): the user's Ctrl-C is already spent on stopping the script."""
    return _exiting and isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)


def note(text: str) -> None:
    """One line for the user on stderr (interrupts), whatever state the interpreter is in."""
    try:
        sys.stderr.write(f"ferry: {text}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


class Blocking:
    """A blocking library call run on a thread of its own while the caller waits in wait(). The interpreter
    raises KeyboardInterrupt only between bytecodes, never inside a ctypes call, so a Ctrl-C during a long
    call (an Egress draining a slow sink) would otherwise be seen only after it returned; the wait here
    is on a lock, which a signal interrupts."""

    def __init__(self, call: Callable[[], Any], name: str):
        self._call = call
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._call()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self._error = e
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        """Returns when the call did, raising what it raised. A KeyboardInterrupt during the wait is raised
        here at once; the call goes on (wait again to see its end)."""
        self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def on_main_thread() -> bool:
    """Signals (Ctrl-C) are handled on the main thread only: elsewhere a blocking call needs no helper."""
    return threading.current_thread() is threading.main_thread()


def _unraisable(u: Any) -> None:
    """A Ctrl-C that lands while a finalizer runs (a ferry Event freed in the user's loop, or any other
    __del__) is "ignored" by the interpreter: the program would go on as if it had never come. Deliver it
    again to the main thread, where the program sees it as the Ctrl-C it was; everything else goes to the
    hook that was there before."""
    if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
        try:
            # From another thread, a moment later: called here, the interrupt would be raised inside this
            # hook at once, and lost with it. Should it land in a finalizer again, it comes back here.
            _thread.start_new_thread(_interrupt_main_soon, ())
            return
        except RuntimeError:  # no new thread at interpreter shutdown: report it as before
            pass
    _previous_unraisable(u)


def _interrupt_main_soon() -> None:
    time.sleep(0.01)
    _thread.interrupt_main()


_previous_unraisable = sys.unraisablehook
sys.unraisablehook = _unraisable


def exit_now(text: str) -> None:
    """Ends the process at once with status 130 (a Ctrl-C that asked to stop waiting), after one line on
    stderr: threads still inside ferry's library would otherwise run on into the interpreter's teardown."""
    note(text)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(130)


@atexit.register
def _close_all() -> None:
    global _exiting
    if _pid != os.getpid():
        return
    _exiting = True
    with _lock:
        objs: List[Any] = [o for _, o in sorted(_open.items(), reverse=True)]
    interrupted = abandon = False
    for o in objs:
        try:
            if abandon and hasattr(o, "abort"):
                o.abort()
            else:
                if interrupted and hasattr(o, "_interrupted"):
                    o._interrupted = True  # the next Ctrl-C abandons its queue too
                o.close()
        except KeyboardInterrupt:
            # Ctrl-C while exit waits on an object (an Egress delivering). A first one let that object
            # deliver what was in flight, as the others still will; once one abandoned its queue (a
            # second Ctrl-C), what is still queued anywhere is abandoned rather than delivered.
            interrupted = True
            abandon = abandon or bool(getattr(o, "_abandoned", False))
        except BaseException as e:  # noqa: BLE001 - exit must go on; the error is still reported
            note(f"closing {type(o).__name__} at exit: {e}")
