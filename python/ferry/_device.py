"""ferry.Device, ferry.Stream and ferry.Event over the C ABI."""
from __future__ import annotations

import json
import threading
from ctypes import byref, c_int, c_void_p
from typing import Any, Callable, Dict, Optional, Tuple

from . import _runtime
from ._c import DeviceHandle, EventHandle, InvalidArgumentError, StreamHandle, lib, take_string

# What libferry_c.so says when asked for a GPU and built without the CUDA toolkit (src/cuda/no_cuda.cpp;
# tests/python/test_package.py keeps the two in step).
NO_CUDA_MARK = "built without the CUDA toolkit"
NO_CUDA_HELP = (
    "this ferry was built without CUDA (host backend only): no CUDA compiler (nvcc) was found when it was "
    "installed. Install the CUDA toolkit (nvcc on the PATH, or /usr/local/cuda) and reinstall from ferry's "
    "source with `FERRY_REQUIRE_CUDA=1 python3 -m pip install --force-reinstall --no-deps .` (the variable "
    "makes the install fail instead of building without CUDA again), or use the emulated device: "
    "ferry.Device(\"host\")")


def _create(backend: str, ordinal: int) -> DeviceHandle:
    h = DeviceHandle()
    try:
        lib.ferry_device_create(backend.encode(), ordinal, byref(h))
    except InvalidArgumentError as e:
        if NO_CUDA_MARK not in str(e):
            raise
        raise InvalidArgumentError(f"ferry.Device({backend!r}, {ordinal}): {NO_CUDA_HELP}", e.status) from None
    return h


class Device:
    """A GPU (backend "cuda") or ferry's emulated device (backend "host"); "auto" takes the GPU when one is
    visible. The host backend runs ferry's pipelines without a GPU: its "device memory" is host memory,
    so CPU tensors stand in for GPU tensors there."""

    def __init__(self, backend: str = "auto", ordinal: int = 0) -> None:
        if backend not in ("auto", "cuda", "host"):
            raise ValueError(f"ferry.Device(backend={backend!r}): expected 'auto', 'cuda' or 'host'")
        if not isinstance(ordinal, int) or ordinal < 0:
            raise ValueError(f"ferry.Device(ordinal={ordinal!r}): expected a device number >= 0")
        self._pid = _runtime.current_pid()
        h = _create(backend, ordinal)
        self._handle: Optional[DeviceHandle] = h
        out = c_void_p()
        lib.ferry_device_info_json(h, byref(out))
        self.info: Dict[str, Any] = json.loads(take_string(out))
        self._default_stream: Optional[Stream] = None
        self._lock = threading.Lock()

    @property
    def handle(self) -> DeviceHandle:
        _runtime.check_owner(self, self._pid)
        return self._handle

    @property
    def backend(self) -> str:
        return self.info["backend"]

    @property
    def ordinal(self) -> int:
        return self.info["ordinal"]

    @property
    def name(self) -> str:
        return self.info["name"]

    def stream(self) -> "Stream":
        """A new stream owned by ferry (on the host backend, the only streams there are)."""
        return Stream(self)

    def default_stream(self) -> "Stream":
        """The stream ferry's Python API uses on the host backend when none is given (made once)."""
        with self._lock:
            if self._default_stream is None:
                self._default_stream = Stream(self)
            return self._default_stream

    def synchronize(self) -> None:
        lib.ferry_device_synchronize(self.handle)

    def __repr__(self) -> str:
        return f"ferry.Device(backend={self.backend!r}, ordinal={self.ordinal}, name={self.name!r})"

    def __del__(self) -> None:
        h = getattr(self, "_handle", None)
        if h is not None and self._pid == _runtime.current_pid():
            self._default_stream = None
            lib.ferry_device_destroy(h)
            self._handle = None


_default_devices: Dict[Tuple[str, int, int], Device] = {}
_default_lock = threading.Lock()


def default_device(backend: str = "auto", ordinal: int = 0) -> Device:
    """One Device per (backend, ordinal) per process, shared by the objects that are given none."""
    key = (backend, ordinal, _runtime.current_pid())
    with _default_lock:
        dev = _default_devices.get(key)
        if dev is None:
            dev = _default_devices[key] = Device(backend, ordinal)
        return dev


class Stream:
    """A stream owned by ferry. `handle` is its native handle (a cudaStream_t on the cuda backend), which
    every ferry call taking a stream accepts; `__cuda_stream__` exposes it to other CUDA libraries."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._pid = _runtime.current_pid()
        h = StreamHandle()
        lib.ferry_stream_create(device.handle, byref(h))
        self._handle: Optional[StreamHandle] = h
        self.handle: int = int(lib.ferry_stream_handle(h))

    def __cuda_stream__(self) -> Tuple[int, int]:
        if self.device.backend != "cuda":
            raise TypeError("a host-backend ferry stream is not a CUDA stream")
        return (0, self.handle)

    def synchronize(self) -> None:
        _runtime.check_owner(self, self._pid)
        lib.ferry_stream_synchronize(self.device.handle, self.handle)

    def __repr__(self) -> str:
        return f"ferry.Stream(0x{self.handle:x} on {self.device.backend}:{self.device.ordinal})"

    def __del__(self) -> None:
        h = getattr(self, "_handle", None)
        if h is not None and self._pid == _runtime.current_pid():
            lib.ferry_stream_destroy(h)
            self._handle = None


class Event:
    """Completion of work ferry queued (an egress copy). `query()` polls, `synchronize()` blocks (without
    the GIL), `wait(stream)` makes a stream wait on the device without blocking the host."""

    def __init__(self, device: Device, handle: EventHandle, stream_resolver: Callable[[Any], int]) -> None:
        self.device = device
        self._handle: Optional[EventHandle] = handle
        self._pid = _runtime.current_pid()
        self._resolve = stream_resolver

    def query(self) -> bool:
        _runtime.check_owner(self, self._pid)
        done = c_int()
        lib.ferry_event_query(self._handle, byref(done))
        return bool(done.value)

    def synchronize(self) -> None:
        _runtime.check_owner(self, self._pid)
        lib.ferry_event_synchronize(self._handle)

    def wait(self, stream: Any = None) -> None:
        """Makes `stream` (default: the current stream) wait for this event, on the device."""
        _runtime.check_owner(self, self._pid)
        lib.ferry_stream_wait_event(self.device.handle, self._resolve(stream), self._handle)

    def __del__(self) -> None:
        h = getattr(self, "_handle", None)
        if h is not None and self._pid == _runtime.current_pid():
            lib.ferry_event_destroy(h)
            self._handle = None


