"""The lifecycle every ferry object shares, and the base of the native objects that own a library handle.

`Lifecycle` is what a user-facing object needs whether or not it owns a handle itself (ferry.torch's
Egress and Prefetcher own native objects): the process that made it (an object used in a forked child
raises ForkedError, see ferry._runtime), close() that is idempotent, a context manager, and one
`_check_usable(what)` that raises ClosedError naming the call ("Egress.submit: the Egress is closed").

`NativeObject` owns one handle of libferry_c.so. Its subclass says how the handle ends (`_destroy`, the
library's destroy function; `_close` when closing does more, such as stopping a pipeline first). close()
ends it once; a NativeObject collected while open ends it quietly in the process that made it, and never
in a forked child (the parent's threads and device state are not the child's: destroying there would join
threads that do not exist). Subclasses are the only Python that holds handles; everything above them
speaks Python objects.

Native objects are not closed at interpreter exit by themselves: the user-facing object that owns one
registers with ferry._runtime, which closes those newest first (a native object made lazily, after its
owner, must not be closed before it).
"""
from __future__ import annotations

from types import TracebackType
from typing import Generic, Optional, Type, TypeVar

from .. import _runtime
from .._c import STATUS, ClosedError

H = TypeVar("H")
Self = TypeVar("Self", bound="Lifecycle")


class Lifecycle:
    """The process that made the object, whether it is closed, and the checks on both.

    Subclasses call `Lifecycle.__init__` first, override `_close()` (what close() does, once; it may raise)
    and, where collection should release something without close()'s waiting, `_finalize()` (default:
    nothing). `_what` names the object in messages (default: the class's name)."""

    _what: str = ""

    def __init__(self) -> None:
        self._pid = _runtime.current_pid()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _name(self) -> str:
        return self._what or type(self).__name__

    def _check_owner(self) -> None:
        """Raises ForkedError when this process is not the one that made the object."""
        _runtime.check_owner(self, self._pid)

    def _owned_here(self) -> bool:
        return getattr(self, "_pid", None) == _runtime.current_pid()

    def _check_usable(self, what: str) -> None:
        """Raises ForkedError in a forked child, ClosedError naming `what` once closed."""
        self._check_owner()
        if self._closed:
            name = self._name()
            raise ClosedError(f"{name}.{what}: the {name} is closed", STATUS["FERRY_ERROR_STOPPED"])

    def close(self) -> None:
        """Ends the object; a second call does nothing. Refused (ForkedError) in a forked child."""
        self._check_owner()
        if self._closed:
            return
        self._closed = True
        self._close()

    def _close(self) -> None:
        """What close() does, once."""

    def _finalize(self) -> None:
        """What collection does to an object still open, in the process that made it; errors are dropped."""

    def __enter__(self: Self) -> Self:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __del__(self) -> None:
        # getattr: an __init__ that failed before Lifecycle.__init__ ran leaves no state.
        if getattr(self, "_closed", True) or not self._owned_here():
            return
        try:
            self._finalize()
        except Exception:  # noqa: BLE001 - a finalizer has nobody to raise to
            pass


class NativeObject(Lifecycle, Generic[H]):
    """Owns one library handle (`handle`, refused once closed or in a forked child). Subclasses pass the
    handle they made to `__init__` and define `_destroy(handle)`; close() and collection both end it
    through `_close()`, which destroys it (override to stop first; collection drops its errors)."""

    def __init__(self, handle: H) -> None:
        super().__init__()
        self._handle: Optional[H] = handle

    @property
    def handle(self) -> H:
        """The library handle, for the native layer's own calls (and the Reducer's comm)."""
        self._check_usable("handle")
        assert self._handle is not None
        return self._handle

    def _destroy(self, handle: H) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not say how its handle ends")

    def _close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            self._destroy(handle)

    def _finalize(self) -> None:
        self._closed = True
        self._close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"open in process {self._pid}"
        return f"<ferry native {self._name()} {state}>"

