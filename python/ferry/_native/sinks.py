"""The library's sinks (ferry_sink): null, checksum, raw file, .npy, and a callback into Python."""
from __future__ import annotations

import ctypes
import threading
import weakref
from ctypes import byref, c_size_t, c_uint64
from typing import Any, Callable, NamedTuple, Optional, Sequence

from .._c import CHUNK_FN, SinkHandle, lib
from ._base import NativeObject


class Sink(NativeObject[SinkHandle]):
    """ferry_sink, made by one of the constructors below."""

    def _destroy(self, handle: SinkHandle) -> None:
        lib.ferry_sink_destroy(handle)


def null_sink() -> Sink:
    h = SinkHandle()
    lib.ferry_sink_null(byref(h))
    return Sink(h)


class ChecksumSink(Sink):
    """ferry_sink_checksum: ferry's 64-bit checksum of every output, by tag."""

    def __init__(self) -> None:
        h = SinkHandle()
        lib.ferry_sink_checksum(byref(h))
        super().__init__(h)

    def checksum(self, tag: int) -> int:
        out = c_uint64()
        lib.ferry_sink_checksum_get(self.handle, tag, byref(out))
        return out.value

    def completed(self) -> int:
        out = c_uint64()
        lib.ferry_sink_checksum_completed(self.handle, byref(out))
        return out.value


def raw_file_sink(directory: str, prefix: str) -> Sink:
    h = SinkHandle()
    lib.ferry_sink_raw_file(directory.encode(), prefix.encode(), byref(h))
    return Sink(h)


def npy_sink(directory: str, shape: Sequence[int], dtype: str, prefix: str) -> Sink:
    """Every output as a .npy of `shape` and `dtype` (a numpy descriptor such as "<f4")."""
    h = SinkHandle()
    dims = (c_size_t * max(1, len(shape)))(*shape)
    lib.ferry_sink_npy(directory.encode(), dims, len(shape), dtype.encode(), prefix.encode(), byref(h))
    return Sink(h)


class Chunk(NamedTuple):
    """One chunk handed to a callback: `data` a read-only memoryview over ferry's pinned slot, valid only
    during the call; the rest is struct ferry_chunk's."""
    data: memoryview
    tag: int
    sequence: int
    offset: int
    total_bytes: int
    index: int
    count: int


class CallbackSink(Sink):
    """ferry_sink_callback: calls `fn(chunk)` (a Chunk) on a ferry worker thread, the GIL held for the call
    alone. The first exception it raises is kept in `error`, fails the Egress, and is raised in place of
    FERRY_ERROR_CALLBACK by the Egress call that sees the failure (ferry._c)."""

    def __init__(self, fn: Callable[[Chunk], Any]) -> None:
        self._fn = fn
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._trampoline = CHUNK_FN(self._call)  # referenced for as long as the library may call it
        h = SinkHandle()
        lib.ferry_sink_callback(self._trampoline, None, byref(h))
        h.python_error = _error_getter(weakref.ref(self))
        super().__init__(h)

    def _call(self, _user: Any, chunk_ptr: Any) -> int:
        try:
            c = chunk_ptr.contents
            view = memoryview((ctypes.c_char * c.bytes).from_address(c.data)).toreadonly()
            self._fn(Chunk(view, c.tag, c.sequence, c.offset, c.total_bytes, c.chunk, c.chunks))
            return 0
        except BaseException as e:  # noqa: BLE001 - reported to the caller of the Egress
            with self._lock:
                if self.error is None:
                    self.error = e
            return 1


def _error_getter(ref: "weakref.ReferenceType[CallbackSink]") -> Callable[[], Optional[BaseException]]:
    def error() -> Optional[BaseException]:
        sink = ref()
        return sink.error if sink is not None else None
    return error
