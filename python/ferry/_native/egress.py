"""ferry_egress: a pool of pinned slots drained to a sink by the library's threads."""
from __future__ import annotations

from ctypes import byref, c_size_t
from typing import Any, Dict

from .._c import EgressHandle, EventHandle, lib
from ._base import NativeObject
from .device import Device, Event
from .library import out_json
from .sinks import Sink


class Egress(NativeObject[EgressHandle]):
    """ferry_egress on `device` into `sink`: `slots` pinned slots of `slot_bytes`, `workers` sink threads,
    deliveries in submission order when `ordered`. A CallbackSink's own exception is raised in place of
    FERRY_ERROR_CALLBACK by every call here (ferry._c's errcheck).

    finish() ends the pipeline (delivers what is queued, stops the threads, raises the first error);
    abort() drops what is queued first. Both leave the handle for stats() and free_slots; close() (or
    collection) destroys it, finishing first if finish() was not called (an error then goes to stderr)."""

    def __init__(self, device: Device, sink: Sink, *, slot_bytes: int, slots: int, workers: int,
                 ordered: bool) -> None:
        h = EgressHandle()
        lib.ferry_egress_create(device.handle, sink.handle, slot_bytes, slots, workers, 1 if ordered else 0,
                                byref(h))
        super().__init__(h)
        self.device, self.sink = device, sink  # both outlive the egress that copies and delivers into them

    def _destroy(self, handle: EgressHandle) -> None:
        lib.ferry_egress_destroy(handle)

    def submit(self, data: int, nbytes: int, stream: int, tag: int) -> Event:
        """Queues the copy of `nbytes` at device address `data` once `stream` reaches this point; blocks
        while every slot is in flight. The Event completes when the copy out of `data` is done."""
        ev = EventHandle()
        lib.ferry_egress_submit(self.handle, data, nbytes, stream, tag, byref(ev))
        return Event(self.device, ev)

    def flush(self) -> None:
        """Waits (without the GIL) until every output submitted so far was consumed by the sink."""
        lib.ferry_egress_flush(self.handle)

    def finish(self) -> None:
        """ferry_egress_close: delivers what is queued, stops the threads, raises the first error."""
        lib.ferry_egress_close(self.handle)

    def abort(self) -> None:
        """Shuts the gate in front of the sink: what is queued is dropped, deliveries under way finish."""
        lib.ferry_egress_abort(self.handle)

    @property
    def free_slots(self) -> int:
        out = c_size_t()
        lib.ferry_egress_free_slots(self.handle, byref(out))
        return out.value

    def stats(self) -> Dict[str, Any]:
        return out_json(lib.ferry_egress_stats_json, self.handle)
