"""ferry.Device, ferry.Stream and ferry.Event: the public faces of ferry._native.device's objects, and one
default device per process."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

from . import _runtime
from ._c import DeviceHandle
from ._native import device as _native
from ._native.device import NO_CUDA_HELP, NO_CUDA_MARK

__all__ = ["Device", "Stream", "Event", "default_device", "NO_CUDA_MARK", "NO_CUDA_HELP"]


class Device:
    """A GPU (backend "cuda") or ferry's emulated device (backend "host"); "auto" takes the GPU when one is
    visible. The host backend runs ferry's pipelines without a GPU: its "device memory" is host memory,
    so CPU tensors stand in for GPU tensors there."""

    def __init__(self, backend: str = "auto", ordinal: int = 0) -> None:
        if backend not in ("auto", "cuda", "host"):
            raise ValueError(f"ferry.Device(backend={backend!r}): expected 'auto', 'cuda' or 'host'")
        if not isinstance(ordinal, int) or ordinal < 0:
            raise ValueError(f"ferry.Device(ordinal={ordinal!r}): expected a device number >= 0")
        self._native = _native.Device(backend, ordinal)
        self.info: Dict[str, Any] = self._native.info
        self._default_stream: Optional[Stream] = None
        self._lock = threading.Lock()

    @property
    def handle(self) -> DeviceHandle:
        return self._native.handle

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
        self._native.synchronize()

    def __repr__(self) -> str:
        return f"ferry.Device(backend={self.backend!r}, ordinal={self.ordinal}, name={self.name!r})"


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
        self._native = _native.Stream(device._native)
        self.handle: int = self._native.native

    def __cuda_stream__(self) -> Tuple[int, int]:
        if self.device.backend != "cuda":
            raise TypeError("a host-backend ferry stream is not a CUDA stream")
        return (0, self.handle)

    def synchronize(self) -> None:
        self._native.synchronize()

    def __repr__(self) -> str:
        return f"ferry.Stream(0x{self.handle:x} on {self.device.backend}:{self.device.ordinal})"


class Event:
    """Completion of work ferry queued (an egress copy). `query()` polls, `synchronize()` blocks (without
    the GIL), `wait(stream)` makes a stream wait on the device without blocking the host."""

    def __init__(self, device: Device, native: _native.Event, stream_resolver: Callable[[Any], int]) -> None:
        self.device = device
        self._native = native
        self._resolve = stream_resolver

    def query(self) -> bool:
        return self._native.query()

    def synchronize(self) -> None:
        self._native.synchronize()

    def wait(self, stream: Any = None) -> None:
        """Makes `stream` (default: the current stream) wait for this event, on the device."""
        self._native.wait(self._resolve(stream))
