"""The C ABI of libferry_c.so (include/ferry/c/ferry.h): every function declared once, loaded once.

tests/python/test_header.py parses ferry.h and fails when a declaration here and the header disagree.
ctypes releases the GIL around every call into the library, so ferry's blocking calls (a submit that
waits for a slot, flush, close, next) never stop other Python threads.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t,
                    c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

ABI_VERSION = 3
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

# struct ferry_kv_store: the key-value store a group's processes share (set, get, erase).
KV_SET_FN = CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t)
KV_GET_FN = CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t, c_int64)
KV_ERASE_FN = CFUNCTYPE(c_int, c_void_p, c_char_p)


class KvStore(Structure):
    """struct ferry_kv_store."""
    _fields_ = [("user", c_void_p), ("set", KV_SET_FN), ("get", KV_GET_FN), ("erase", KV_ERASE_FN)]

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

class Handle(c_void_p):
    """An opaque ferry handle. Each kind is its own ctypes type, and a function of the declaration table
    refuses a handle of another kind (ctypes.ArgumentError) before the library sees it: an egress handle
    cannot reach ferry_prefetch_next. None passes as NULL (the destroy functions accept it)."""

    @classmethod
    def from_param(cls, obj: Any) -> Any:
        if obj is None or isinstance(obj, cls):
            return obj
        raise TypeError(f"expected a {cls.__name__}, got {type(obj).__name__}")


class DeviceHandle(Handle):
    """ferry_device*"""


class StreamHandle(Handle):
    """ferry_stream*"""


class EventHandle(Handle):
    """ferry_event*"""


class AnalysisHandle(Handle):
    """ferry_analysis*"""


class SinkHandle(Handle):
    """ferry_sink*. `python_error`, where a CallbackSink sets it, returns the exception its callable raised:
    the egress functions raise that exception in place of FERRY_ERROR_CALLBACK."""
    python_error: Optional[Callable[[], Optional[BaseException]]] = None


class EgressHandle(Handle):
    """ferry_egress*; `sink` is the SinkHandle it was made with (set by ferry_egress_create's errcheck)."""
    sink: Optional[SinkHandle] = None


class PrefetchHandle(Handle):
    """ferry_prefetch*"""


class BatchHandle(Handle):
    """ferry_batch*"""


class CommHandle(Handle):
    """ferry_comm*"""


class ReducerHandle(Handle):
    """ferry_reducer*"""


class JpegDecoderHandle(Handle):
    """ferry_jpeg_decoder*"""


# The C type name of each handle in ferry.h (tests/python/test_header.py checks every use).
HANDLES = {"ferry_device": DeviceHandle, "ferry_stream": StreamHandle, "ferry_event": EventHandle,
           "ferry_analysis": AnalysisHandle, "ferry_sink": SinkHandle, "ferry_egress": EgressHandle,
           "ferry_prefetch": PrefetchHandle, "ferry_batch": BatchHandle,
           "ferry_comm": CommHandle, "ferry_reducer": ReducerHandle,
           "ferry_jpeg_decoder": JpegDecoderHandle}


class Status(c_int):
    """The return type of the functions that return a ferry_status: their errcheck raises the status's
    exception with the library's message, and returns 0 otherwise (so a caller's own `check(...)` or
    `if status != 0` is harmless)."""


_dev, _stream, _event, _analysis = DeviceHandle, StreamHandle, EventHandle, AnalysisHandle
_sink, _egress, _prefetch, _batch = SinkHandle, EgressHandle, PrefetchHandle, BatchHandle
_comm, _reducer = CommHandle, ReducerHandle
_jpeg_decoder = JpegDecoderHandle
P = POINTER
# name: (return type, argument types), in the header's order.
DECLARATIONS: Dict[str, Tuple[Any, List[Any]]] = {
    "ferry_version": (c_char_p, []),
    "ferry_abi_version": (c_int, []),
    "ferry_last_error": (c_char_p, []),
    "ferry_string_free": (None, [c_void_p]),
    "ferry_checksum_of": (c_uint64, [c_void_p, c_size_t]),
    "ferry_device_create": (Status, [c_char_p, c_int, P(_dev)]),
    "ferry_device_destroy": (None, [_dev]),
    "ferry_device_info_json": (Status, [_dev, P(c_void_p)]),
    "ferry_device_synchronize": (Status, [_dev]),
    "ferry_stream_create": (Status, [_dev, P(_stream)]),
    "ferry_stream_handle": (c_uintptr, [_stream]),
    "ferry_stream_destroy": (None, [_stream]),
    "ferry_stream_synchronize": (Status, [_dev, c_uintptr]),
    "ferry_stream_wait_event": (Status, [_dev, c_uintptr, _event]),
    "ferry_event_query": (Status, [_event, P(c_int)]),
    "ferry_event_synchronize": (Status, [_event]),
    "ferry_event_destroy": (None, [_event]),
    "ferry_probe_run": (Status, [_dev, c_size_t, c_int, c_int, c_size_t, P(c_void_p)]),
    "ferry_analyze_file": (Status, [c_char_p, c_char_p, c_double, c_double, c_double, P(_analysis)]),
    "ferry_analysis_json": (c_char_p, [_analysis]),
    "ferry_analysis_text": (c_char_p, [_analysis]),
    "ferry_analysis_write_html": (Status, [_analysis, c_char_p]),
    "ferry_analysis_destroy": (None, [_analysis]),
    "ferry_sink_null": (Status, [P(_sink)]),
    "ferry_sink_checksum": (Status, [P(_sink)]),
    "ferry_sink_checksum_get": (Status, [_sink, c_uint64, P(c_uint64)]),
    "ferry_sink_checksum_completed": (Status, [_sink, P(c_uint64)]),
    "ferry_sink_raw_file": (Status, [c_char_p, c_char_p, P(_sink)]),
    "ferry_sink_npy": (Status, [c_char_p, P(c_size_t), c_size_t, c_char_p, c_char_p, P(_sink)]),
    "ferry_sink_callback": (Status, [CHUNK_FN, c_void_p, P(_sink)]),
    "ferry_sink_destroy": (None, [_sink]),
    "ferry_egress_create": (Status, [_dev, _sink, c_size_t, c_size_t, c_size_t, c_int, P(_egress)]),
    "ferry_egress_submit": (Status, [_egress, c_void_p, c_size_t, c_uintptr, c_uint64, P(_event)]),
    "ferry_egress_flush": (Status, [_egress]),
    "ferry_egress_close": (Status, [_egress]),
    "ferry_egress_abort": (Status, [_egress]),
    "ferry_egress_free_slots": (Status, [_egress, P(c_size_t)]),
    "ferry_egress_stats_json": (Status, [_egress, P(c_void_p)]),
    "ferry_egress_destroy": (None, [_egress]),
    "ferry_prefetch_create": (Status, [_dev, c_size_t, c_size_t, c_size_t, c_size_t, c_size_t, P(_prefetch)]),
    "ferry_prefetch_slot_bytes": (Status, [_prefetch, P(c_size_t)]),
    "ferry_prefetch_create_slots": (Status, [_dev, c_void_p, c_size_t, c_size_t, c_size_t, P(_prefetch)]),
    "ferry_prefetch_slot_wait": (Status, [_prefetch, c_uint64, c_int64, P(c_int)]),
    "ferry_prefetch_slot_ready": (Status, [_prefetch, c_uint64]),
    "ferry_prefetch_slot_offset": (Status, [_prefetch, c_uint64, P(c_size_t)]),
    "ferry_copy_strided": (Status, [c_void_p, c_void_p, c_size_t, P(c_int64), P(c_int64), c_size_t]),
    "ferry_prefetch_slot_event_fd": (Status, [_prefetch, P(c_int)]),
    "ferry_prefetch_push": (Status, [_prefetch, P(c_void_p), P(c_size_t), P(c_size_t), c_size_t,
                                     P(c_uint64)]),
    "ferry_prefetch_next": (Status, [_prefetch, c_uintptr, P(_batch)]),
    "ferry_prefetch_released": (Status, [_prefetch, c_uint64, P(c_int)]),
    "ferry_prefetch_stats_json": (Status, [_prefetch, P(c_void_p)]),
    "ferry_prefetch_close": (Status, [_prefetch]),
    "ferry_prefetch_destroy": (None, [_prefetch]),
    "ferry_batch_data": (c_void_p, [_batch]),
    "ferry_batch_number": (c_uint64, [_batch]),
    "ferry_batch_dlpack": (Status, [_batch, c_size_t, c_int32, P(c_int64), c_uint8, c_uint8, c_uint16,
                                    P(c_void_p)]),
    "ferry_dlpack_delete": (None, [c_void_p]),
    "ferry_batch_release": (None, [_batch]),
    "ferry_comm_open": (Status, [_dev, c_char_p, c_double, P(_comm)]),
    "ferry_comm_open_store": (Status, [_dev, P(KvStore), c_char_p, c_int, c_int, c_double, P(_comm)]),
    "ferry_comm_rank": (Status, [_comm, P(c_int), P(c_int)]),
    "ferry_comm_backend": (c_char_p, [_comm]),
    "ferry_comm_all_reduce": (Status, [_comm, c_void_p, c_void_p, c_size_t, c_char_p, c_char_p, c_uintptr]),
    "ferry_comm_broadcast": (Status, [_comm, c_void_p, c_void_p, c_size_t, c_char_p, c_int, c_uintptr]),
    "ferry_comm_all_reduce_mean": (Status, [_comm, c_void_p, c_size_t, c_char_p, c_uintptr]),
    "ferry_comm_codecs_json": (Status, [P(c_void_p)]),
    "ferry_comm_abort": (Status, [_comm, c_char_p]),
    "ferry_comm_destroy": (None, [_comm]),
    "ferry_reducer_create": (Status, [_comm, P(c_int64), P(c_int64), c_size_t, c_char_p, P(_reducer)]),
    "ferry_reducer_layout": (Status, [_reducer, P(c_uint64), P(c_int)]),
    "ferry_reducer_begin_step": (Status, [_reducer]),
    "ferry_reducer_flat_dlpack": (Status, [_reducer, P(c_void_p)]),
    "ferry_reducer_place": (Status, [_reducer, c_size_t, P(c_size_t), P(c_size_t)]),
    "ferry_reducer_mark_ready": (Status, [_reducer, c_size_t, c_uintptr]),
    "ferry_reducer_mark_ready_many": (Status, [_reducer, P(c_size_t), c_size_t, c_uintptr]),
    "ferry_reducer_buckets": (Status, [_reducer, P(c_size_t), c_size_t, P(c_int)]),
    "ferry_reducer_hooks_arm": (Status, [_reducer, c_uintptr]),
    "ferry_reducer_grad_hook": (None, [_reducer, c_size_t, c_void_p]),
    "ferry_reducer_grad_node_hook": (None, [_reducer, c_size_t, c_void_p, c_void_p]),
    "ferry_reducer_hooks_state": (Status, [_reducer, P(c_size_t), P(c_int64), P(c_int64), P(c_void_p)]),
    "ferry_reducer_hooks_flags": (Status, [_reducer, P(c_uint8), P(c_uint8), c_size_t]),
    "ferry_reducer_finish": (Status, [_reducer, c_uintptr]),
    "ferry_reducer_stats_json": (Status, [_reducer, P(c_void_p)]),
    "ferry_reducer_destroy": (None, [_reducer]),
    "ferry_jpeg_info": (Status, [c_void_p, c_size_t, P(c_int32)]),
    "ferry_jpeg_refusal": (c_char_p, [c_void_p, c_size_t]),
    "ferry_image_boxes": (Status, [c_size_t, P(c_int32), P(c_int32), P(c_uint64), c_int, P(c_double), P(c_int32)]),
    "ferry_jpeg_decode_crop": (Status, [c_void_p, c_size_t, P(c_int32), c_int32, c_int, c_void_p, c_size_t]),
    "ferry_jpeg_decode_crop_batch": (Status, [c_size_t, P(c_void_p), P(c_size_t), P(c_int32), c_int32, c_int,
                                              c_void_p, c_size_t, c_int]),
    "ferry_jpeg_gpu_library_json": (Status, [c_char_p, P(c_void_p)]),
    "ferry_jpeg_decoder_create": (Status, [_dev, c_char_p, P(_jpeg_decoder)]),
    "ferry_jpeg_decoder_decode": (Status, [_jpeg_decoder, c_size_t, P(c_void_p), P(c_size_t), P(c_int32), c_int32,
                                           c_void_p, c_int, c_int, P(c_float), P(c_float), c_uintptr, P(c_int32),
                                           P(_event)]),
    "ferry_jpeg_decoder_image": (Status, [_jpeg_decoder, c_size_t, P(c_uint8), c_size_t, P(c_int32), P(c_int32),
                                          P(c_int32)]),
    "ferry_jpeg_decoder_stats_json": (Status, [_jpeg_decoder, P(c_void_p)]),
    "ferry_jpeg_decoder_destroy": (None, [_jpeg_decoder]),
}


class FerryError(RuntimeError):
    """An error reported by ferry's library; `status` is its ferry_status code."""

    def __init__(self, message: str, status: int = STATUS["FERRY_ERROR_INTERNAL"]) -> None:
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


_ERRORS: Dict[int, Type[FerryError]] = {1: InvalidArgumentError, 2: CudaError, 3: OutOfMemoryError,
                                         4: ClosedError, 5: InputError, 6: SystemError_, 7: CallbackError}


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


def error_of(status: int, message: str) -> FerryError:
    """The exception of a failing ferry_status."""
    return _ERRORS.get(status, FerryError)(message, status)


def _raise_on_failure(result: Status, func: Any, args: Tuple[Any, ...]) -> int:
    """errcheck of every function that returns a ferry_status."""
    status = result.value
    if status == 0:
        return 0
    message = last_error()
    if status == STATUS["FERRY_ERROR_CALLBACK"] and args and isinstance(args[0], EgressHandle):
        # A CallbackSink's callable failed: its own exception is the one to see.
        sink = args[0].sink
        error = sink.python_error() if sink is not None and sink.python_error is not None else None
        if error is not None:
            raise error
    raise error_of(status, message)


def _egress_created(result: Status, func: Any, args: Tuple[Any, ...]) -> int:
    status = _raise_on_failure(result, func, args)
    args[-1]._obj.sink = args[1]  # byref(EgressHandle) -> the handle; remembers its sink (see above)
    return status


def _load() -> Tuple[ctypes.CDLL, str]:
    path = _find_library()
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in DECLARATIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
        if restype is Status:
            fn.errcheck = _egress_created if name == "ferry_egress_create" else _raise_on_failure
    version = lib.ferry_abi_version()
    if version != ABI_VERSION:
        raise ImportError(f"ferry: {path} has C ABI version {version}; this package needs {ABI_VERSION}")
    return lib, str(path)


lib, library_path = _load()


def last_error() -> str:
    return (lib.ferry_last_error() or b"").decode("utf-8", "replace")


def check(status: int) -> None:
    """Raises the exception of a failing status, with the library's message. The declared functions raise
    through their errcheck already; this serves a status obtained some other way."""
    if status != 0:
        raise error_of(status, last_error())


def take_string(ptr: c_void_p) -> str:
    """The text of a char* the library returned, freed."""
    try:
        return ctypes.string_at(ptr.value).decode("utf-8")
    finally:
        lib.ferry_string_free(ptr)
