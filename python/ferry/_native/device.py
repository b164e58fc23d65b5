"""A device, its streams and events (ferry_device, ferry_stream, ferry_event) as native objects.

Streams are named by their native handle (an int: a cudaStream_t on the cuda backend, a ferry stream's
handle on either), as every library call that takes a stream accepts them; ferry.torch turns torch's
streams into those ints.
"""
from __future__ import annotations

from ctypes import byref, c_int
from typing import Any, Dict

from .._c import DeviceHandle, EventHandle, InvalidArgumentError, StreamHandle, lib
from ._base import NativeObject
from .library import out_json

# What libferry_c.so says when asked for a GPU and built without the CUDA toolkit (src/cuda/no_cuda.cpp;
# tests/python/test_package.py keeps the two in step).
NO_CUDA_MARK = "built without the CUDA toolkit"
NO_CUDA_HELP = (
    "this ferry was built without CUDA (host backend only): no CUDA compiler (nvcc) was found when it was "
    "installed. Install the CUDA toolkit (nvcc on the PATH, or /usr/local/cuda) and reinstall from ferry's "
    "source with `FERRY_REQUIRE_CUDA=1 python3 -m pip install --force-reinstall --no-deps .` (the variable "
    "makes the install fail instead of building without CUDA again), or use the emulated device: "
    "ferry.Device(\"host\")")


class Device(NativeObject[DeviceHandle]):
    """ferry_device: backend "auto", "cuda" or "host" and an ordinal. `info` is ferry_device_info_json's
    object (backend, ordinal, name, ...). Raises InvalidArgumentError with the way out when a GPU is asked
    of a library built without CUDA."""

    def __init__(self, backend: str, ordinal: int) -> None:
        h = DeviceHandle()
        try:
            lib.ferry_device_create(backend.encode(), ordinal, byref(h))
        except InvalidArgumentError as e:
            if NO_CUDA_MARK not in str(e):
                raise
            raise InvalidArgumentError(f"ferry.Device({backend!r}, {ordinal}): {NO_CUDA_HELP}", e.status) from None
        super().__init__(h)
        self.info: Dict[str, Any] = out_json(lib.ferry_device_info_json, h)

    def _destroy(self, handle: DeviceHandle) -> None:
        lib.ferry_device_destroy(handle)

    @property
    def ordinal(self) -> int:
        """The device's number (its GPU's CUDA ordinal on the cuda backend), as the library reports it."""
        return int(self.info["ordinal"])

    def synchronize(self) -> None:
        lib.ferry_device_synchronize(self.handle)

    def synchronize_stream(self, stream: int) -> None:
        """Waits until the work queued on `stream` (a native stream handle of this device) is done."""
        lib.ferry_stream_synchronize(self.handle, stream)

    def wait_event(self, stream: int, event: "Event") -> None:
        """Makes `stream` wait for `event` on the device (the host does not wait)."""
        lib.ferry_stream_wait_event(self.handle, stream, event.handle)


class Stream(NativeObject[StreamHandle]):
    """ferry_stream: a stream ferry owns on `device`; `native` is its handle as the library's calls take it."""

    def __init__(self, device: Device) -> None:
        h = StreamHandle()
        lib.ferry_stream_create(device.handle, byref(h))
        super().__init__(h)
        self.device = device  # outlives the stream: destroyed after it
        self.native: int = int(lib.ferry_stream_handle(h))

    def _destroy(self, handle: StreamHandle) -> None:
        lib.ferry_stream_destroy(handle)

    def synchronize(self) -> None:
        self._check_usable("synchronize")
        self.device.synchronize_stream(self.native)


class Event(NativeObject[EventHandle]):
    """ferry_event: the completion of work ferry queued (an egress copy), made by the call that queued it."""

    def __init__(self, device: Device, handle: EventHandle) -> None:
        super().__init__(handle)
        self.device = device

    def _destroy(self, handle: EventHandle) -> None:
        lib.ferry_event_destroy(handle)

    def query(self) -> bool:
        done = c_int()
        lib.ferry_event_query(self.handle, byref(done))
        return bool(done.value)

    def synchronize(self) -> None:
        lib.ferry_event_synchronize(self.handle)

    def wait(self, stream: int) -> None:
        self.device.wait_event(stream, self)
