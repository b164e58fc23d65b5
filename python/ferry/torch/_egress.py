"""ferry.torch.Egress: drains GPU tensors to a sink through ferry's pinned pool, off the caller's path."""
from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Optional, Tuple, Type, Union

from .. import _runtime
from .._device import Device, Event
from .._native import Lifecycle, egress as _native
from ..sinks import CallbackSink, ChunkInfo, Sink, as_sink
from ._common import (DeviceLike, StreamLike, check_on_device, dlpack_stream, resolve_device, shape_text,
                      stream_handle, tensor_info)

if TYPE_CHECKING:
    import numpy

SinkLike = Union[Sink, Callable[["numpy.ndarray", ChunkInfo], Any], None]

class Egress(Lifecycle):
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

    Ctrl-C, as for the ferry command: a KeyboardInterrupt leaving a `with Egress(...)` block (or the
    script, the Egress closed at exit) stops the submitting and delivers what is in flight, so every
    output submitted lands whole; a second Ctrl-C during that abandons what is still queued (no output
    is handed to the sink after it, and a file sink leaves none of those under a final name), waits only
    for the deliveries under way and raises KeyboardInterrupt; a third ends the process at once with
    status 130 (the outputs under way stay under their temporary names). A Ctrl-C during close() or
    flush() is seen at once, not when the wait ends, and one that lands while a finalizer runs (an Event
    freed in the loop) is delivered again rather than lost.

    On ferry's host backend (no GPU) CPU tensors stand in for GPU tensors and ferry.Stream objects for
    CUDA streams."""

    def __init__(self, sink: SinkLike = None, slots: int = 8, slot_bytes: int = 64 << 20, workers: int = 4,
                 ordered: bool = True, device: DeviceLike = None):
        for name, v in (("slots", slots), ("slot_bytes", slot_bytes), ("workers", workers)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Egress({name}={v!r}): expected an integer >= 1")
        if slot_bytes % 8 != 0:
            raise ValueError(f"Egress(slot_bytes={slot_bytes}): must be a multiple of 8 (every chunk starts on "
                             "an 8-byte checksum word)")
        super().__init__()
        self.device: Device = resolve_device(device)
        self.sink: Sink = as_sink(sink)
        self.sink._attach(self)
        self.slots, self.slot_bytes, self.workers, self.ordered = slots, slot_bytes, workers, bool(ordered)
        self._egress: Optional[_native.Egress] = None  # made once the sink is ready (NpySink: the first output)
        self._interrupted = False  # a Ctrl-C was seen: the next one abandons what is queued
        self._abandoned = False  # a Ctrl-C or abort() dropped what was queued
        self._lock = threading.Lock()
        # (Event, tensor) until the copy out of the tensor is done
        self._held: Deque[Tuple[Event, Any]] = collections.deque()
        self._submitted = 0
        if self.sink._ready:
            self._create()
        _runtime.register(self)

    def _create(self) -> None:
        self._egress = _native.Egress(self.device._native, self.sink._native_sink(), slot_bytes=self.slot_bytes,
                                      slots=self.slots, workers=self.workers, ordered=self.ordered)

    def _resolver(self, stream: StreamLike) -> int:
        return stream_handle(self.device, stream)

    def _release_done(self, all_done: bool = False) -> None:
        while self._held and (all_done or self._held[0][0].query()):
            self._held.popleft()

    def submit(self, tensor: Any, stream: StreamLike = None, tag: Optional[int] = None) -> Event:
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
            if self._egress is None:
                self._create()
            assert self._egress is not None
            if isinstance(self.sink, CallbackSink):
                # The library numbers outputs from 0 as they are queued, as _submitted counts them.
                self.sink._expect(self._submitted, info.shape, info)
            self._release_done()
            native_event = self._egress.submit(info.data, info.nbytes, handle, tag)
            self._submitted += 1
            event = Event(self.device, native_event, self._resolver)
            self._held.append((event, tensor))
        return event

    def flush(self) -> None:
        """Waits (without the GIL) until every output submitted so far was consumed by the sink; raises
        the first error of the sink or a copy. Ctrl-C ends the wait at once (what is in flight goes on)."""
        self._check_usable("flush")
        egress = self._egress
        if egress is None:
            return
        if _runtime.on_main_thread():
            _runtime.Blocking(egress.flush, "ferry-egress-flush").wait()
        else:
            egress.flush()
        with self._lock:
            self._release_done(all_done=True)

    def close(self) -> None:
        """Delivers what is in flight, stops the threads and raises the first error. Idempotent. A first
        Ctrl-C during the wait lets it finish, then raises KeyboardInterrupt; a second abandons what is
        queued (see the class)."""
        super().close()

    def _close(self) -> None:
        egress = self._egress
        if egress is None:
            return
        # A Ctrl-C before this close (the one leaving a `with` block or ending the script) or during it
        # lets what is in flight finish; the next one abandons what is queued.
        interrupted = self._interrupted or _runtime.exiting_on_interrupt()
        if not _runtime.on_main_thread():
            try:
                egress.finish()
            finally:
                self._held.clear()
            return
        wait = _runtime.Blocking(egress.finish, "ferry-egress-close")
        caught = False  # a Ctrl-C arrived during this wait: raised once the drain is done
        tell = interrupted
        while True:
            # Everything from here on may be interrupted anywhere (a Ctrl-C is raised between any two
            # bytecodes, the note's write included), and every such interrupt is the same next one.
            try:
                if tell:
                    tell = False
                    self._note_draining()
                wait.wait()
                break
            except KeyboardInterrupt:
                if interrupted:
                    self._abandon(wait)
                    _runtime.note(f"interrupted again: the Egress abandoned {self.stats().get('dropped', 0)} "
                                  "queued deliveries")
                    raise
                interrupted = caught = tell = self._interrupted = True
            except BaseException:
                self._held.clear()  # close waited for every copy, failed or not
                raise
        self._held.clear()
        if caught:
            raise KeyboardInterrupt

    def _note_draining(self) -> None:
        busy = self.slots - self.free_slots
        _runtime.note(f"interrupted: the Egress delivers what is in flight ({busy} of {self.slots} slots busy); "
                      "interrupt again to abandon it")

    def _abandon(self, closing: Optional[_runtime.Blocking]) -> None:
        """Shuts the gate in front of the sink and waits (a further Ctrl-C ends the wait) for the close to
        return: deliveries under way finish, the queued ones are dropped."""
        assert self._egress is not None
        self._egress.abort()
        self._abandoned = True
        if closing is None:
            closing = _runtime.Blocking(self._egress.finish, "ferry-egress-close")
        try:
            closing.wait()
        except KeyboardInterrupt:
            # A third Ctrl-C: stop now. The deliveries under way are inside the library's threads, which
            # must not run on into the interpreter's teardown; a file sink leaves them under their
            # temporary names, never under a final one.
            _runtime.exit_now("interrupted a third time: exiting now (outputs under way are left under "
                              "their temporary names)")
        except Exception:  # noqa: BLE001 - the abandoning itself (FERRY_ERROR_STOPPED), or a sink error
            pass            # before it: both moot once the caller gives up what is queued
        self._held.clear()

    def abort(self) -> None:
        """Abandons what is queued and closes: no output is handed to the sink after this call (a file sink
        leaves none of them under its final name); deliveries under way finish. Raises no sink error:
        call close() instead to deliver everything and see errors. Idempotent."""
        self._check_owner()
        if self._closed:
            return
        self._closed = True
        if self._egress is not None:
            self._abandon(None)

    @property
    def free_slots(self) -> int:
        if self._egress is None:
            return self.slots
        return self._egress.free_slots

    def stats(self) -> Dict[str, Any]:
        """Counters and stage times: outputs, deliveries, bytes, d2h_gbps, pin_seconds, stages, dropped
        (deliveries not made because the Egress failed or was aborted), ..."""
        if self._egress is None:
            return {}
        return self._egress.stats()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        if issubclass(exc_type, KeyboardInterrupt):
            # The first Ctrl-C: deliver what is in flight; close() raises a second one after abandoning.
            self._interrupted = True
            try:
                self.close()
            except Exception:  # noqa: BLE001 - the Ctrl-C is the one to see
                pass
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the exception already propagating is the one to see
            pass

    def _finalize(self) -> None:
        # Collected while open: the library's destroy closes, waiting for the copies out of the tensors
        # still held here (so before they go with this object); an error nobody collected is reported on
        # stderr by the library.
        if self._egress is not None:
            self._egress.close()
