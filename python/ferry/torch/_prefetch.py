"""ferry.torch.Prefetcher: CPU batches from any iterable, staged by ferry's threads and prefetched to
the GPU on ferry's copy stream."""
from __future__ import annotations

import gc
import json
from ctypes import byref, c_int, c_int64, c_size_t, c_uint64, c_void_p
from typing import Any, List, Optional, Tuple

from .. import _runtime
from .._c import STATUS, ClosedError, check, lib, take_string
from .._dlpack import KDL_CPU, KDL_CUDA_HOST, make_capsule
from ._common import resolve_device, shape_text, stream_handle, tensor_info

_ALIGN = 256


class _Leaf:
    """A tensor's place in a batch: where its bytes go in the slot, and what tensor to make there."""
    __slots__ = ("offset", "shape", "code", "bits", "lanes", "nbytes")

    def __init__(self, offset, info):
        self.offset = offset
        self.shape = info.shape
        self.code, self.bits, self.lanes = info.code, info.bits, info.lanes
        self.nbytes = info.nbytes


def _flatten(obj, path: str, tensors: List[Tuple[str, Any]]):
    """A template of `obj` where each tensor is replaced by its index in `tensors`."""
    import torch
    if isinstance(obj, torch.Tensor):
        tensors.append((path, obj))
        return _Slot(len(tensors) - 1)
    if isinstance(obj, dict):
        return type(obj)((k, _flatten(v, f"{path}[{k!r}]", tensors)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_flatten(v, f"{path}.{f}", tensors) for f, v in zip(obj._fields, obj)))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_flatten(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj))
    return obj


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _fill(template, values):
    if isinstance(template, _Slot):
        return values[template.index]
    if isinstance(template, dict):
        return type(template)((k, _fill(v, values)) for k, v in template.items())
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(_fill(v, values) for v in template))
    if isinstance(template, (tuple, list)):
        return type(template)(_fill(v, values) for v in template)
    return template


class Prefetcher:
    """Iterates over `iterable`'s CPU batches (a tensor, or tuples, lists, dicts and namedtuples of
    tensors, other values passed through) as CUDA tensors, `depth` batches ahead of the consumer.

    Each batch's tensors are copied by ferry's C++ worker threads (no GIL held) into a pinned slot, then to
    a device slot on ferry's copy stream; the yielded tensors view that device slot (zero copy), and the
    current stream (at the time of next()) waits for their copy on the device, so work queued there may
    use them at once. Give it a DataLoader *without* pin_memory: ferry pins its own slots once.

    Lifetime: a batch's device slot is reused only after every tensor of that batch has been freed, and
    then only after an event recorded on the stream that was current at its next() (so kernels queued
    there that still read it finish first). Batch k + depth goes into batch k's slot, so keeping a batch
    for longer than `depth - 1` further next() calls raises RuntimeError naming it instead of stalling:
    .clone() what you keep. A `for` loop holds the previous batch while it asks for the next one, hence
    depth >= 2.

    Memory: `slots` pinned and `depth` device slots of the largest batch (the first batch's size unless
    `batch_bytes` is given). On ferry's host backend (no GPU) the yielded tensors are CPU tensors, ready
    when next() returns."""

    def __init__(self, iterable, depth: int = 2, device=None, *, workers: int = 4, slots: int = 2,
                 batch_bytes: Optional[int] = None, lookahead: Optional[int] = None):
        for name, v, low in (("depth", depth, 2), ("workers", workers, 1), ("slots", slots, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"Prefetcher({name}={v!r}): expected an integer >= {low}" +
                                 (" (a for loop holds one batch while it asks for the next)" if name == "depth" else ""))
        if batch_bytes is not None and (not isinstance(batch_bytes, int) or batch_bytes < 1):
            raise ValueError(f"Prefetcher(batch_bytes={batch_bytes!r}): expected an integer >= 1 or None")
        self._pid = _runtime.current_pid()
        self.device = resolve_device(device)
        self.depth, self.workers, self.slots = depth, workers, slots
        self.batch_bytes = batch_bytes
        self.lookahead = lookahead if lookahead is not None else slots + depth
        if not isinstance(self.lookahead, int) or self.lookahead < 1:
            raise ValueError(f"Prefetcher(lookahead={lookahead!r}): expected an integer >= 1")
        self._it = iter(iterable)
        self._handle: Optional[c_void_p] = None
        self._capacity = 0
        self._pending = {}  # batch number -> (template, leaves, source tensors kept until it is copied)
        self._pushed = 0
        self._yielded = 0
        self._exhausted = False
        self._closed = False
        _runtime.register(self)

    def __iter__(self):
        return self

    def _create(self, first_bytes: int) -> None:
        want = max(first_bytes, self.batch_bytes or 0, 1)
        h = c_void_p()
        check(lib.ferry_prefetch_create(self.device.handle, want, 0, self.workers, self.slots, self.depth,
                                        byref(h)))
        self._handle = h
        self._capacity = want

    def _push_one(self, batch) -> None:
        tensors: List[Tuple[str, Any]] = []
        template = _flatten(batch, "batch", tensors)
        leaves, offset = [], 0
        for path, t in tensors:
            info = tensor_info(t, None)
            if info.device_type not in (KDL_CPU, KDL_CUDA_HOST):
                raise ValueError(f"{path} is on {info.device_name}; Prefetcher takes CPU batches (give it a "
                                 "DataLoader without pin_memory and let ferry copy them)")
            if not info.contiguous:
                raise ValueError(f"{path} ({shape_text(info)}) is not contiguous; make the dataset or collate_fn "
                                 "return contiguous tensors")
            offset = (offset + _ALIGN - 1) // _ALIGN * _ALIGN
            leaves.append((_Leaf(offset, info), info.data))
            offset += info.nbytes
        if self._handle is None:
            self._create(offset)
        if offset > self._capacity:
            raise ValueError(f"batch {self._pushed} needs {offset} bytes; the Prefetcher's slots hold "
                             f"{self._capacity} (sized by the first batch): pass batch_bytes= the largest batch")
        n = len(leaves)
        data = (c_void_p * max(n, 1))(*[d for _, d in leaves])
        sizes = (c_size_t * max(n, 1))(*[leaf.nbytes for leaf, _ in leaves])
        offsets = (c_size_t * max(n, 1))(*[leaf.offset for leaf, _ in leaves])
        number = c_uint64()
        check(lib.ferry_prefetch_push(self._handle, data, sizes, offsets, n, byref(number)))
        self._pending[number.value] = (template, [leaf for leaf, _ in leaves], tensors)
        self._pushed += 1

    def _top_up(self) -> None:
        while not self._exhausted and self._pushed - self._yielded < self.lookahead:
            try:
                batch = next(self._it)
            except StopIteration:
                self._exhausted = True
                break
            self._push_one(batch)

    def _released(self, number: int) -> bool:
        out = c_int()
        check(lib.ferry_prefetch_released(self._handle, number, byref(out)))
        return bool(out.value)

    def __next__(self):
        _runtime.check_owner(self, self._pid)
        if self._closed:
            if self._exhausted and self._yielded == self._pushed:
                raise StopIteration
            raise ClosedError("Prefetcher.__next__: the Prefetcher is closed", STATUS["FERRY_ERROR_STOPPED"])
        self._top_up()
        if self._yielded == self._pushed:
            self.close()
            raise StopIteration
        n = self._yielded
        held = n - self.depth
        if held >= 0 and not self._released(held):
            gc.collect()  # tensors of that batch may only be waiting in a reference cycle
            if not self._released(held):
                raise RuntimeError(
                    f"Prefetcher: batch {n} goes into the device slot of batch {held}, whose tensors are still "
                    f"alive; a batch is valid for {self.depth - 1} further next() calls: .clone() what you keep "
                    "or raise depth")
        consumer = stream_handle(self.device, None)
        b = c_void_p()
        check(lib.ferry_prefetch_next(self._handle, consumer, byref(b)))
        try:
            template, leaves, _sources = self._pending.pop(n)
            values = [self._tensor(b, leaf) for leaf in leaves]
        finally:
            lib.ferry_batch_release(b)
        self._yielded += 1
        if self.device.backend == "host":
            # The host backend's "kernels" are the caller's own CPU code: it reads the tensors at once.
            check(lib.ferry_stream_synchronize(self.device.handle, consumer))
        return _fill(template, values)

    def _tensor(self, b: c_void_p, leaf: _Leaf):
        import torch.utils.dlpack
        shape = (c_int64 * max(len(leaf.shape), 1))(*leaf.shape)
        managed = c_void_p()
        check(lib.ferry_batch_dlpack(b, leaf.offset, len(leaf.shape), shape, leaf.code, leaf.bits, leaf.lanes,
                                     byref(managed)))
        try:
            return torch.utils.dlpack.from_dlpack(make_capsule(managed.value))
        except BaseException:
            lib.ferry_dlpack_delete(managed)
            raise

    def stats(self) -> dict:
        """Counters and stage times: batches, bytes, h2d_gbps, pin_seconds, stages (fill, copy, ...)."""
        if self._handle is None:
            return {}
        out = c_void_p()
        check(lib.ferry_prefetch_stats_json(self._handle, byref(out)))
        return json.loads(take_string(out))

    def close(self) -> None:
        """Stops ferry's threads; batches already yielded stay valid while their tensors live."""
        _runtime.check_owner(self, self._pid)
        if self._closed:
            return
        self._closed = True
        if self._handle is not None:
            check(lib.ferry_prefetch_close(self._handle))
        self._pending.clear()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None and self._pid == _runtime.current_pid():
            self._handle = None
            # Joins the workers before the source tensors they may be copying are freed with this object;
            # the device slots stay valid while tensors made from them live.
            lib.ferry_prefetch_close(h)
            lib.ferry_prefetch_destroy(h)
