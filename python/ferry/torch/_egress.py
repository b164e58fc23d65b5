"""ferry.torch.Egress: drains GPU tensors to a sink through ferry's pinned pool, off the caller's path."""
from __future__ import annotations

import collections
import json
import threading
from ctypes import byref, c_size_t, c_void_p
from typing import Optional

from .. import _runtime
from .._c import STATUS, ClosedError, check, lib, take_string
from .._device import Device, Event
from ..sinks import CallbackSink, Sink, as_sink
from ._common import check_on_device, dlpack_stream, resolve_device, shape_text, stream_handle, tensor_info


class Egress:
    """Copies tensors off the device into a fixed pool of pinned slots on ferry's own copy stream, and
    hands each finished copy to `sink` on worker threads.

    submit(tensor, stream) returns at once (unless every slot is in flight: back-pressure) with an Event
    that completes when the copy out of `tensor` is done. The copy starts once `stream` (default: the
    current stream) reaches the point of the call: an event handshake, never a host synchronization. The
    Egress keeps a reference to the tensor until its copy is done, so torch's caching allocator cannot
    hand its memory to another tensor earlier; a caller that rewrites the same tensor in place (a static
    CUDA-graph output) must first make its stream wait: `event.wait()`.

    Sinks: NullSink, ChecksumSink, RawFileSink, NpySink, or any callable, which becomes a CallbackSink
    (`fn(view, chunk)` on a ferry worker thread). Outputs larger than `slot_bytes` go through as chunks
    of one slot each. A sink's exception is raised in the caller at its next submit, flush or close.
    Memory: slots * slot_bytes of pinned host memory, allocated here, once.

    On ferry's host backend (no GPU) CPU tensors stand in for GPU tensors and ferry.Stream objects for
    CUDA streams."""

    def __init__(self, sink=None, slots: int = 8, slot_bytes: int = 64 << 20, workers: int = 4,
                 ordered: bool = True, device=None):
        for name, v in (("slots", slots), ("slot_bytes", slot_bytes), ("workers", workers)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Egress({name}={v!r}): expected an integer >= 1")
        if slot_bytes % 8 != 0:
            raise ValueError(f"Egress(slot_bytes={slot_bytes}): must be a multiple of 8 (every chunk starts on "
                             "an 8-byte checksum word)")
        self._pid = _runtime.current_pid()
        self.device: Device = resolve_device(device)
        self.sink: Sink = as_sink(sink)
        self.sink._attach(self)
        self.slots, self.slot_bytes, self.workers, self.ordered = slots, slot_bytes, workers, bool(ordered)
        self._handle: Optional[c_void_p] = None
        self._closed = False
        self._lock = threading.Lock()
        self._held = collections.deque()  # (Event, tensor) until the copy out of the tensor is done
        self._submitted = 0
        if self.sink._handle is not None:
            self._create()
        _runtime.register(self)

    def _create(self) -> None:
        h = c_void_p()
        check(lib.ferry_egress_create(self.device.handle, self.sink._c_handle(), self.slot_bytes, self.slots,
                                      self.workers, 1 if self.ordered else 0, byref(h)))
        self._handle = h

    def _resolver(self, stream) -> int:
        return stream_handle(self.device, stream)

    def _check_usable(self, what: str) -> None:
        _runtime.check_owner(self, self._pid)
        if self._closed:
            raise ClosedError(f"Egress.{what}: the Egress is closed", STATUS["FERRY_ERROR_STOPPED"])

    def _raise(self, status: int) -> None:
        if status == STATUS["FERRY_ERROR_CALLBACK"] and isinstance(self.sink, CallbackSink) and self.sink.error:
            raise self.sink.error
        check(status)

    def _release_done(self, all_done: bool = False) -> None:
        while self._held and (all_done or self._held[0][0].query()):
            self._held.popleft()

    def submit(self, tensor, stream=None, tag: Optional[int] = None) -> Event:
        """Queues the copy of `tensor` (contiguous, on this Egress's device) after `stream`'s current point;
        `tag` (default: the submission number) names the output to the sink (file names, checksums).
        Returns an Event that completes when the copy out of `tensor` is done."""
        self._check_usable("submit")
        handle = stream_handle(self.device, stream)
        info = tensor_info(tensor, dlpack_stream(self.device, handle))
        check_on_device(info, self.device, "the tensor")
        if not info.contiguous:
            raise ValueError(f"the tensor ({shape_text(info)}) is not contiguous; call .contiguous() first")
        if info.nbytes == 0:
            raise ValueError(f"the tensor ({shape_text(info)}) holds no bytes; there is nothing to copy")
        with self._lock:
            if tag is None:
                tag = self._submitted
            if not isinstance(tag, int) or isinstance(tag, bool) or tag < 0:
                raise ValueError(f"tag {tag!r}: expected an integer >= 0")
            self.sink._accept(info, info.shape)
            if self._handle is None:
                self._create()
            if isinstance(self.sink, CallbackSink):
                self.sink._expect(tag, info.shape, info)
            self._release_done()
            ev = c_void_p()
            status = lib.ferry_egress_submit(self._handle, info.data, info.nbytes, handle, tag, byref(ev))
            if status != 0:
                self._raise(status)
            self._submitted += 1
            event = Event(self.device, ev, self._resolver)
            self._held.append((event, tensor))
        return event

    def flush(self) -> None:
        """Waits (without the GIL) until every output submitted so far was consumed by the sink; raises
        the first error of the sink or a copy."""
        self._check_usable("flush")
        if self._handle is None:
            return
        status = lib.ferry_egress_flush(self._handle)
        with self._lock:
            self._release_done(all_done=status == 0)
        if status != 0:
            self._raise(status)

    def close(self) -> None:
        """Delivers what is in flight, stops the threads and raises the first error. Idempotent."""
        _runtime.check_owner(self, self._pid)
        if self._closed:
            return
        self._closed = True
        if self._handle is None:
            return
        status = lib.ferry_egress_close(self._handle)
        with self._lock:
            self._held.clear()  # close waited for every copy, failed or not
        if status != 0:
            self._raise(status)

    @property
    def free_slots(self) -> int:
        if self._handle is None:
            return self.slots
        out = c_size_t()
        check(lib.ferry_egress_free_slots(self._handle, byref(out)))
        return out.value

    def stats(self) -> dict:
        """Counters and stage times: outputs, deliveries, bytes, d2h_gbps, pin_seconds, stages, ..."""
        if self._handle is None:
            return {}
        out = c_void_p()
        check(lib.ferry_egress_stats_json(self._handle, byref(out)))
        return json.loads(take_string(out))

    def __enter__(self) -> "Egress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            try:
                self.close()
            except BaseException:  # noqa: BLE001 - the exception already propagating is the one to see
                pass

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None and self._pid == _runtime.current_pid():
            self._handle = None
            lib.ferry_egress_destroy(h)  # closes; an error nobody collected is reported on stderr
