"""The C ABI of libferry_c.so (include/ferry/c/ferry.h): every function declared once, loaded once.

tests/python/test_header.py parses ferry.h and fails when a declaration here and the header disagree.
ctypes releases the GIL around every call into the library, so ferry's blocking calls (a submit that
waits for a slot, flush, close, next) never stop other Python threads.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t,
                    c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)
from pathlib import Path

ABI_VERSION = 1
LIBRARY_NAME = "libferry_c.so"
c_uintptr = c_size_t  # uintptr_t: pointer-sized on every platform ferry builds for


class Chunk(Structure):
    """struct ferry_chunk."""
    _fields_ = [
        ("sequence", c_uint64),
        ("tag", c_uint64),
        ("offset", c_uint64),
        ("total_bytes", c_uint64),
        ("chunk", c_uint32),
        ("chunks", c_uint32),
        ("data", c_void_p),
        ("bytes", c_size_t),
    ]


CHUNK_FN = CFUNCTYPE(c_int, c_void_p, POINTER(Chunk))

# Status codes (enum ferry_status).
STATUS = {
    "FERRY_OK": 0,
    "FERRY_ERROR_INVALID": 1,
    "FERRY_ERROR_CUDA": 2,
    "FERRY_ERROR_OUT_OF_MEMORY": 3,
    "FERRY_ERROR_STOPPED": 4,
    "FERRY_ERROR_INPUT": 5,
    "FERRY_ERROR_SYSTEM": 6,
    "FERRY_ERROR_CALLBACK": 7,
    "FERRY_ERROR_INTERNAL": 8,
}

_h = c_void_p  # every opaque handle
# name: (return type, argument types), in the header's order.
DECLARATIONS = {
    "ferry_version": (c_char_p, []),
    "ferry_abi_version": (c_int, []),
    "ferry_last_error": (c_char_p, []),
    "ferry_string_free": (None, [c_void_p]),
    "ferry_checksum_of": (c_uint64, [c_void_p, c_size_t]),
    "ferry_device_create": (c_int, [c_char_p, c_int, POINTER(_h)]),
    "ferry_device_destroy": (None, [_h]),
    "ferry_device_info_json": (c_int, [_h, POINTER(c_void_p)]),
    "ferry_device_synchronize": (c_int, [_h]),
    "ferry_stream_create": (c_int, [_h, POINTER(_h)]),
    "ferry_stream_handle": (c_uintptr, [_h]),
    "ferry_stream_destroy": (None, [_h]),
    "ferry_stream_synchronize": (c_int, [_h, c_uintptr]),
    "ferry_stream_wait_event": (c_int, [_h, c_uintptr, _h]),
    "ferry_event_query": (c_int, [_h, POINTER(c_int)]),
    "ferry_event_synchronize": (c_int, [_h]),
    "ferry_event_destroy": (None, [_h]),
    "ferry_probe_run": (c_int, [_h, c_size_t, c_int, c_int, c_size_t, POINTER(c_void_p)]),
    "ferry_analyze_file": (c_int, [c_char_p, c_char_p, c_double, c_double, c_double, POINTER(_h)]),
    "ferry_analysis_json": (c_char_p, [_h]),
    "ferry_analysis_text": (c_char_p, [_h]),
    "ferry_analysis_write_html": (c_int, [_h, c_char_p]),
    "ferry_analysis_destroy": (None, [_h]),
    "ferry_sink_null": (c_int, [POINTER(_h)]),
    "ferry_sink_checksum": (c_int, [POINTER(_h)]),
    "ferry_sink_checksum_get": (c_int, [_h, c_uint64, POINTER(c_uint64)]),
    "ferry_sink_checksum_completed": (c_int, [_h, POINTER(c_uint64)]),
    "ferry_sink_raw_file": (c_int, [c_char_p, c_char_p, POINTER(_h)]),
    "ferry_sink_npy": (c_int, [c_char_p, POINTER(c_size_t), c_size_t, c_char_p, c_char_p, POINTER(_h)]),
    "ferry_sink_callback": (c_int, [CHUNK_FN, c_void_p, POINTER(_h)]),
    "ferry_sink_destroy": (None, [_h]),
    "ferry_egress_create": (c_int, [_h, _h, c_size_t, c_size_t, c_size_t, c_int, POINTER(_h)]),
    "ferry_egress_submit": (c_int, [_h, c_void_p, c_size_t, c_uintptr, c_uint64, POINTER(_h)]),
    "ferry_egress_flush": (c_int, [_h]),
    "ferry_egress_close": (c_int, [_h]),
    "ferry_egress_free_slots": (c_int, [_h, POINTER(c_size_t)]),
    "ferry_egress_stats_json": (c_int, [_h, POINTER(c_void_p)]),
    "ferry_egress_destroy": (None, [_h]),
    "ferry_prefetch_create": (c_int, [_h, c_size_t, c_size_t, c_size_t, c_size_t, c_size_t, POINTER(_h)]),
    "ferry_prefetch_slot_bytes": (c_int, [_h, POINTER(c_size_t)]),
    "ferry_prefetch_push": (c_int, [_h, POINTER(c_void_p), POINTER(c_size_t), POINTER(c_size_t), c_size_t,
                                    POINTER(c_uint64)]),
    "ferry_prefetch_next": (c_int, [_h, c_uintptr, POINTER(_h)]),
    "ferry_prefetch_released": (c_int, [_h, c_uint64, POINTER(c_int)]),
    "ferry_prefetch_stats_json": (c_int, [_h, POINTER(c_void_p)]),
    "ferry_prefetch_close": (c_int, [_h]),
    "ferry_prefetch_destroy": (None, [_h]),
    "ferry_batch_data": (c_void_p, [_h]),
    "ferry_batch_number": (c_uint64, [_h]),
    "ferry_batch_dlpack": (c_int, [_h, c_size_t, c_int32, POINTER(c_int64), c_uint8, c_uint8, c_uint16,
                                   POINTER(c_void_p)]),
    "ferry_dlpack_delete": (None, [c_void_p]),
    "ferry_batch_release": (None, [_h]),
}


class FerryError(RuntimeError):
    """An error reported by ferry's library; `status` is its ferry_status code."""

    def __init__(self, message: str, status: int = STATUS["FERRY_ERROR_INTERNAL"]):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(FerryError, ValueError):
    """Misuse or a bad argument (FERRY_ERROR_INVALID)."""


class CudaError(FerryError):
    """The CUDA runtime failed (FERRY_ERROR_CUDA)."""


class OutOfMemoryError(FerryError, MemoryError):
    """Device or pinned memory could not be had (FERRY_ERROR_OUT_OF_MEMORY)."""


class ClosedError(FerryError):
    """The object was closed (FERRY_ERROR_STOPPED)."""


class InputError(FerryError, ValueError):
    """A file's content was refused (FERRY_ERROR_INPUT)."""


class SystemError_(FerryError, OSError):
    """The operating system refused, for example a file or directory (FERRY_ERROR_SYSTEM)."""


class CallbackError(FerryError):
    """A callback sink failed (FERRY_ERROR_CALLBACK); the Python exception is raised in its place."""


_ERRORS = {1: InvalidArgumentError, 2: CudaError, 3: OutOfMemoryError, 4: ClosedError, 5: InputError,
           6: SystemError_, 7: CallbackError}


def _find_library() -> Path:
    here = Path(__file__).resolve().parent / LIBRARY_NAME
    if here.is_file():
        return here
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ImportError(f"ferry: FERRY_LIBRARY={env} is not a file")
        return path
    raise ImportError(f"ferry: {LIBRARY_NAME} is neither next to the package ({here}) nor named by the "
                      "FERRY_LIBRARY environment variable; install with `python3 -m pip install .` or build "
                      "the ferry_c target and set FERRY_LIBRARY to build/<preset>/src/c/libferry_c.so")


def _load():
    path = _find_library()
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in DECLARATIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.ferry_abi_version()
    if version != ABI_VERSION:
        raise ImportError(f"ferry: {path} has C ABI version {version}; this package needs {ABI_VERSION}")
    return lib, path


lib, library_path = _load()


def last_error() -> str:
    return (lib.ferry_last_error() or b"").decode("utf-8", "replace")


def check(status: int) -> None:
    """Raises the exception of a failing status, with the library's message."""
    if status != 0:
        raise _ERRORS.get(status, FerryError)(last_error(), status)


def take_string(ptr: c_void_p) -> str:
    """The text of a char* the library returned, freed."""
    try:
        return ctypes.string_at(ptr.value).decode("utf-8")
    finally:
        lib.ferry_string_free(ptr)
