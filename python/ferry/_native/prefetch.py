"""ferry_prefetch: batches staged into pinned slots by the library's threads and copied to device slots on
its copy stream, lent as ferry_batch until their tensors are gone."""
from __future__ import annotations

from ctypes import byref, c_int, c_int64, c_size_t, c_uint64, c_void_p
from typing import Any, Callable, Dict, Sequence, Tuple, TypeVar

from .._c import BatchHandle, PrefetchHandle, lib
from ._base import NativeObject
from .device import Device
from .dlpack import hand_over
from .library import out_json

T = TypeVar("T")


class Batch(NativeObject[BatchHandle]):
    """One batch lent by next(): its device slot stays lent while this hold or a tensor made over it
    lives; close() (or a with block) drops this hold."""

    def _destroy(self, handle: BatchHandle) -> None:
        lib.ferry_batch_release(handle)

    @property
    def number(self) -> int:
        return int(lib.ferry_batch_number(self.handle))

    def tensor(self, offset: int, shape: Sequence[int], dtype: Tuple[int, int, int],
               convert: Callable[[Any], T]) -> T:
        """convert(capsule) of a C-contiguous DLPack tensor viewing `offset` of the batch, of `shape` and
        DLPack dtype (code, bits, lanes); the tensor holds the batch until it is freed."""
        dims = (c_int64 * max(len(shape), 1))(*shape)
        managed = c_void_p()
        lib.ferry_batch_dlpack(self.handle, offset, len(shape), dims, *dtype, byref(managed))
        return hand_over(managed.value, convert)


class Prefetch(NativeObject[PrefetchHandle]):
    """What every ferry_prefetch answers, however it was made. stop() ends the copies (waiting for those
    under way; batches lent stay valid, stats() still answers); close() stops and frees it."""

    def __init__(self, handle: PrefetchHandle) -> None:
        super().__init__(handle)
        self._stopped = False

    def released(self, number: int) -> bool:
        """Whether batch `number`'s device slot came back (every tensor of it freed, its event done)."""
        out = c_int()
        lib.ferry_prefetch_released(self.handle, c_uint64(number), byref(out))
        return bool(out.value)

    def next(self, consumer: int) -> Batch:
        """The next batch on the device; the `consumer` stream (a native handle) waits for its copy."""
        b = BatchHandle()
        lib.ferry_prefetch_next(self.handle, consumer, byref(b))
        return Batch(b)

    def stats(self) -> Dict[str, Any]:
        """Counters and stage times: batches, bytes, h2d_gbps, pin_seconds, stages (fill, copy, ...)."""
        return out_json(lib.ferry_prefetch_stats_json, self.handle)

    def stop(self) -> None:
        """Stops ferry's threads (waits for the copies under way); batches lent stay valid."""
        self._check_usable("stop")
        if not self._stopped:
            self._stopped = True
            lib.ferry_prefetch_close(self.handle)

    def _destroy(self, handle: PrefetchHandle) -> None:
        try:
            if not self._stopped:
                self._stopped = True
                # Joins the workers before anything they may be copying from is freed by the caller.
                lib.ferry_prefetch_close(handle)
        finally:
            lib.ferry_prefetch_destroy(handle)


class Prefetcher(Prefetch):
    """ferry_prefetch_create on `device`: `slots` pinned and `depth` device slots of `batch_bytes`, filled
    by `workers` threads from the host memory push() names."""

    def __init__(self, device: Device, *, batch_bytes: int, workers: int, slots: int, depth: int) -> None:
        h = PrefetchHandle()
        lib.ferry_prefetch_create(device.handle, batch_bytes, 0, workers, slots, depth, byref(h))
        super().__init__(h)
        self.device = device  # outlives the prefetcher
        self.batch_bytes = batch_bytes

    def push(self, data: Sequence[int], sizes: Sequence[int], offsets: Sequence[int]) -> int:
        """Queues one batch: `sizes[i]` bytes at host address `data[i]` go to `offsets[i]` of its slot. The
        memory must stay valid until the batch was copied (next() lent it, or stop() returned). Returns the
        batch's number."""
        n = len(data)
        number = c_uint64()
        lib.ferry_prefetch_push(self.handle, (c_void_p * max(n, 1))(*data), (c_size_t * max(n, 1))(*sizes),
                                (c_size_t * max(n, 1))(*offsets), n, byref(number))
        return number.value
