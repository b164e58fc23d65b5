"""ferry.torch.Prefetcher: CPU batches from any iterable, staged by ferry's threads and prefetched to
the GPU on ferry's copy stream."""
from __future__ import annotations

import collections
import sys
import warnings
from typing import Any, Deque, Dict, Generic, Iterable, Iterator, List, Optional, Tuple, TypeVar, Union

from .. import _runtime
from .._native import Lifecycle, prefetch as _native
from .._native.dlpack import KDL_CPU, KDL_CUDA_HOST, TensorInfo
from .._template import Slot as _Slot, fill as _fill
from ._batch import batch_tensor, crossing as _crossing, slot_still_held
from ._common import DeviceLike, resolve_device, shape_text, stream_handle

_ALIGN = 256
T = TypeVar("T")
_NO_SOURCE = object()


class _Leaf:
    """A tensor's place in a batch: where its bytes go in the slot, what tensor to make there, and, for a
    dtype that crosses as bytes (bool, where DLPack refuses it), the dtype and shape to view them as."""
    __slots__ = ("offset", "shape", "code", "bits", "lanes", "nbytes", "restore")

    def __init__(self, offset: int, info: TensorInfo, restore: Optional[Tuple[Any, Tuple[int, ...]]]):
        self.offset = offset
        self.shape = info.shape
        self.code, self.bits, self.lanes = info.code, info.bits, info.lanes
        self.nbytes = info.nbytes
        self.restore = restore


def _flatten(obj: Any, path: str, values: List[Tuple[str, Any]]) -> Any:
    """A template of `obj` where each tensor or numpy array is replaced by its index in `values`."""
    import numpy as np
    import torch
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        values.append((path, obj))
        return _Slot(len(values) - 1)
    if isinstance(obj, dict):
        return type(obj)((k, _flatten(v, f"{path}[{k!r}]", values)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_flatten(v, f"{path}.{f}", values) for f, v in zip(obj._fields, obj)))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_flatten(v, f"{path}[{i}]", values) for i, v in enumerate(obj))
    return obj


def _as_tensor(where: str, x: Any) -> Any:
    """The torch tensor a batch field becomes on the device: a numpy array as a tensor over its memory,
    a tensor that requires grad detached (a batch is data, not part of a graph), conjugate or negative
    views resolved (DLPack cannot carry them). Raises ValueError naming the field otherwise."""
    import numpy as np
    import torch
    if isinstance(x, np.ndarray):
        try:
            with warnings.catch_warnings():  # a read-only array: ferry only reads it
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(x)
        except (TypeError, RuntimeError) as e:
            raise ValueError(f"{where} is a numpy array of dtype {x.dtype}, which torch has no tensor for "
                             f"({e}); convert it in the dataset or collate_fn") from None
    if x.layout != torch.strided:
        raise ValueError(f"{where} is a {x.layout} tensor; Prefetcher copies dense tensors: call .to_dense() "
                         "in the dataset or collate_fn")
    if x.requires_grad:
        x = x.detach()
    if x.is_conj():
        x = x.resolve_conj()
    if hasattr(x, "is_neg") and x.is_neg():
        x = x.resolve_neg()
    return x


class _Pushed:
    """A batch in ferry's pipeline: its number there, its structure, and the source tensors, kept alive
    until it is copied."""
    __slots__ = ("index", "number", "template", "leaves", "sources")

    def __init__(self, index: int, number: int, template: Any, leaves: List[_Leaf], sources: List[Any]):
        self.index, self.number, self.template, self.leaves, self.sources = index, number, template, leaves, sources


class _Copied:
    """A batch larger than ferry's slots (Prefetcher's oversize="copy"): copied with .to() at its turn."""
    __slots__ = ("index", "template", "values")

    def __init__(self, index: int, template: Any, values: List[Any]):
        self.index, self.template, self.values = index, template, values


class _Failed:
    """The source raised, or a field was refused, at batch `index`: raised when the consumer gets there."""
    __slots__ = ("index", "error", "by_source")

    def __init__(self, index: int, error: BaseException, by_source: bool):
        self.index, self.error, self.by_source = index, error, by_source


class _EpochState:
    """One epoch: a pass over the source."""

    def __init__(self, number: int, it: Iterator[Any]):
        self.number = number
        self.it = it
        self.pulled = 0    # batches taken from the source
        self.yielded = 0   # batches handed to the consumer
        self.ended = False  # the source has no more (or failed)
        self.exhausted_source = False  # it raised StopIteration
        self.queue: Deque[Union[_Pushed, _Copied, _Failed]] = collections.deque()


class _Epoch(Iterator[T]):
    """The iterator of one epoch (what `iter(prefetcher)` returns)."""

    def __init__(self, owner: "Prefetcher[T]", state: _EpochState):
        self._owner = owner
        self._state = state

    def __iter__(self) -> "_Epoch[T]":
        return self

    def __next__(self) -> T:
        return self._owner._next(self._state)

    def __length_hint__(self) -> int:
        try:
            return max(len(self._owner) - self._state.yielded, 0)
        except TypeError:
            return 0


class Prefetcher(Lifecycle, Generic[T]):
    """Iterates over `iterable`'s CPU batches (a tensor or numpy array, or tuples, lists, dicts and
    namedtuples of them, other values passed through) as CUDA tensors, `depth` batches ahead of the
    consumer.

    Each batch's tensors are copied by ferry's C++ worker threads (no GIL held) into a pinned slot, then to
    a device slot on ferry's copy stream; the yielded tensors view that device slot (zero copy), and the
    current stream (at the time of next()) waits for their copy on the device, so work queued there may
    use them at once. Give it a DataLoader *without* pin_memory: ferry pins its own slots once.

    Epochs, as a DataLoader: every `for` (every iter()) is a new epoch, a new pass over `iterable`; one
    that starts before the previous epoch ended (after a `break`) abandons the rest of it, and ferry then
    sets up its slots anew (the old ones are freed with the batches still using them). A source that is
    an iterator (a generator) passes once: a new epoch after it ran out raises TypeError. len() is the
    source's len(), when it has one (tqdm shows a total). next(prefetcher) continues the current epoch
    (starting the first). An exception raised by the source is raised at the batch where it happened,
    after the batches before it; on Python >= 3.11 it carries a note naming that batch.

    Attributes the Prefetcher has not are the source's: `prefetcher.sampler`, `.dataset`, `.batch_size` of
    a DataLoader (public names only). Each batch keeps the structure the source gave it (a DataLoader's
    lists stay lists, a collate_fn's tuples tuples).

    Fields: numpy arrays become tensors; tensors that require grad are detached; bool tensors (which
    DLPack refuses on older torch) cross as their bytes; a field that cannot cross (sparse, non-contiguous,
    an object array) is refused with its place in the batch, as in `batch[1]` or `batch['mask']`.

    Batch sizes: ferry's slots hold `batch_bytes`, or the first batch's size when it is None, so a
    smaller batch (a DataLoader's last one without drop_last) always fits. A batch larger than the
    slots (variable shapes) goes, with oversize="copy" (the default), by a plain `.to(device)` on the
    caller's thread, slower, with one warning naming the size to pass as batch_bytes; oversize="error"
    raises ValueError instead. Set batch_bytes to the largest batch to prefetch every batch.

    Lifetime: a batch's device slot is reused only after every tensor of that batch has been freed, and
    then only after an event recorded on the stream that was current at its next() (so kernels queued
    there that still read it finish first). Batch k + depth goes into batch k's slot, so keeping a batch
    for longer than `depth - 1` further next() calls raises RuntimeError naming it instead of stalling:
    .clone() what you keep. A `for` loop holds the previous batch while it asks for the next one, hence
    depth >= 2.

    Memory: `slots` pinned and `depth` device slots of the batch size above, held until close() (or
    until the Prefetcher is collected, or the interpreter exits). On ferry's host backend (no GPU) the
    yielded tensors are CPU tensors, ready when next() returns."""

    def __init__(self, iterable: Iterable[T], depth: int = 2, device: DeviceLike = None, *, workers: int = 4,
                 slots: int = 2, batch_bytes: Optional[int] = None, lookahead: Optional[int] = None,
                 oversize: str = "copy"):
        for name, v, low in (("depth", depth, 2), ("workers", workers, 1), ("slots", slots, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"Prefetcher({name}={v!r}): expected an integer >= {low}" +
                                 (" (a for loop holds one batch while it asks for the next)" if name == "depth" else ""))
        if batch_bytes is not None and (not isinstance(batch_bytes, int) or isinstance(batch_bytes, bool)
                                        or batch_bytes < 1):
            raise ValueError(f"Prefetcher(batch_bytes={batch_bytes!r}): expected an integer >= 1 or None")
        if oversize not in ("copy", "error"):
            raise ValueError(f"Prefetcher(oversize={oversize!r}): expected 'copy' or 'error'")
        if not hasattr(iterable, "__iter__"):
            raise TypeError(f"Prefetcher: {type(iterable).__name__} is not iterable")
        Lifecycle.__init__(self)
        self.device = resolve_device(device)
        self.depth, self.workers, self.slots = depth, workers, slots
        self.batch_bytes = batch_bytes
        self.oversize = oversize
        self.lookahead: int = lookahead if lookahead is not None else slots + depth
        if not isinstance(self.lookahead, int) or isinstance(self.lookahead, bool) or self.lookahead < 1:
            raise ValueError(f"Prefetcher(lookahead={lookahead!r}): expected an integer >= 1")
        self._source = iterable
        self._pipeline: Optional[_native.Prefetcher] = None
        self._capacity = 0
        self._epoch: Optional[_EpochState] = None
        self._epochs = 0
        self._warned_oversize = False
        _runtime.register(self)

    # ---- epochs ----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        """A new epoch: a new pass over the source (see the class)."""
        return _Epoch(self, self._start_epoch())

    def __next__(self) -> T:
        """The next batch of the current epoch, starting the first if none has started."""
        state = self._epoch if self._epoch is not None else self._start_epoch()
        return self._next(state)

    def __len__(self) -> int:
        """The number of batches of an epoch: the source's len()."""
        if not hasattr(self._source, "__len__"):
            raise TypeError(f"Prefetcher over a {type(self._source).__name__} has no len(): its source has none")
        return len(self._source)  # type: ignore[arg-type]

    def __bool__(self) -> bool:
        return True  # not len(): a Prefetcher over a source without len() is still an object, not empty

    def __getattr__(self, name: str) -> Any:
        """The source's attribute, for a name the Prefetcher has not: a DataLoader's sampler, dataset,
        batch_size, drop_last... (`len(loader.sampler)`, `loader.sampler.set_epoch(epoch)` keep working
        once the loader is wrapped). Only public names, and only once __init__ has stored the source: a
        private or special name, or any name while the object is half made (in __init__, __del__ after
        a failed __init__, unpickling), is the Prefetcher's own, so nothing recurses."""
        source = self.__dict__.get("_source", _NO_SOURCE) if not name.startswith("_") else _NO_SOURCE
        if source is _NO_SOURCE:
            raise AttributeError(f"'Prefetcher' object has no attribute {name!r}")
        try:
            return getattr(source, name)
        except AttributeError:
            raise AttributeError(f"'Prefetcher' object has no attribute {name!r}, nor has its source (a "
                                 f"{type(source).__name__})") from None

    def _start_epoch(self) -> _EpochState:
        self._check_usable("__iter__")
        old = self._epoch
        if old is not None and any(isinstance(e, _Pushed) for e in old.queue):
            # Batches of the abandoned epoch are queued in ferry's pipeline ahead of the new one's; draining
            # them could wait for a slot the caller still holds (the loop variable), so start a new pipeline.
            self._retire_pipeline()
        if old is not None:
            old.queue.clear()
            old.ended = True
        it = iter(self._source)
        if it is self._source and old is not None and old.exhausted_source:
            raise TypeError(f"Prefetcher: a new epoch needs the source again, but it is a "
                            f"{type(self._source).__name__}, an iterator that was used up by the previous epoch; "
                            "give a re-iterable source (a DataLoader, a list) or make a new Prefetcher")
        self._epoch = _EpochState(self._epochs, it)
        self._epochs += 1
        return self._epoch

    def _retire_pipeline(self) -> None:
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.close()  # waits for the copies under way; lent batches stay valid

    # ---- staging -----------------------------------------------------------------------------------

    def _create(self, first_bytes: int) -> None:
        want = max(first_bytes, self.batch_bytes or 0, self._capacity, 1)
        self._pipeline = _native.Prefetcher(self.device._native, batch_bytes=want, workers=self.workers,
                                            slots=self.slots, depth=self.depth)
        self._capacity = want

    def _stage(self, batch: Any, index: int) -> Union[_Pushed, _Copied]:
        fields: List[Tuple[str, Any]] = []
        template = _flatten(batch, "batch", fields)
        values, crossing = [], []
        offset = 0
        for path, x in fields:
            where = f"{path} of batch {index}"
            t = _as_tensor(where, x)
            raw, info, restore = _crossing(where, t)
            if info.device_type not in (KDL_CPU, KDL_CUDA_HOST):
                raise ValueError(f"{where} is on {info.device_name}; Prefetcher takes CPU batches (give it a "
                                 "DataLoader without pin_memory and let ferry copy them)")
            if not info.contiguous:
                raise ValueError(f"{where} ({shape_text(info)}) is not contiguous; make the dataset or "
                                 "collate_fn return contiguous tensors")
            offset = (offset + _ALIGN - 1) // _ALIGN * _ALIGN
            crossing.append((_Leaf(offset, info, restore), info.data, raw))
            values.append(t)
            offset += info.nbytes
        if self._pipeline is None:
            self._create(offset)
        assert self._pipeline is not None
        if offset > self._capacity:
            return self._oversize(index, offset, template, values)
        number = self._pipeline.push([d for _, d, _ in crossing], [leaf.nbytes for leaf, _, _ in crossing],
                                     [leaf.offset for leaf, _, _ in crossing])
        return _Pushed(index, number, template, [leaf for leaf, _, _ in crossing], [r for _, _, r in crossing])

    def _oversize(self, index: int, nbytes: int, template: Any, values: List[Any]) -> _Copied:
        sized = f"batch_bytes={self.batch_bytes}" if self.batch_bytes else "the first batch"
        if self.oversize == "error":
            raise ValueError(f"Prefetcher: batch {index} needs {nbytes} bytes; ferry's slots hold {self._capacity} "
                             f"(sized by {sized}): pass batch_bytes= the largest batch, or oversize='copy'")
        if not self._warned_oversize:
            self._warned_oversize = True
            warnings.warn(f"Prefetcher: batch {index} needs {nbytes} bytes, more than ferry's slots hold "
                          f"({self._capacity}, sized by {sized}); such batches go by a plain .to(device) on this "
                          f"thread; pass batch_bytes={nbytes} (or the largest batch) to prefetch every batch",
                          RuntimeWarning, stacklevel=6)
        return _Copied(index, template, values)

    def _top_up(self, ep: _EpochState) -> None:
        while not ep.ended and len(ep.queue) < self.lookahead:
            index = ep.pulled
            try:
                batch = next(ep.it)
            except StopIteration:
                ep.ended = ep.exhausted_source = True
                break
            except Exception as e:  # noqa: BLE001 - raised when the consumer reaches this batch
                ep.queue.append(_Failed(index, e, by_source=True))
                ep.ended = True
                break
            ep.pulled += 1
            try:
                ep.queue.append(self._stage(batch, index))
            except Exception as e:  # noqa: BLE001 - raised when the consumer reaches this batch
                ep.queue.append(_Failed(index, e, by_source=False))  # its message names the batch
                ep.ended = True

    # ---- the consumer's side -------------------------------------------------------------------------

    def _next(self, ep: _EpochState) -> Any:
        self._check_usable("__next__")
        if ep is not self._epoch:
            raise RuntimeError("Prefetcher: this epoch was abandoned when a newer one started (a Prefetcher runs "
                               "one epoch at a time)")
        self._top_up(ep)
        return self._take(ep)

    def _take(self, ep: _EpochState) -> Any:
        # Apart from _next: a source's exception kept for later holds its traceback, whose frames link
        # back to the _next that pulled it; a frame kept that way keeps its locals, so the batch must not
        # be one of _next's (it would stay alive, and its slot lent, until the error is raised).
        if not ep.queue:
            raise StopIteration
        entry = ep.queue[0]
        if isinstance(entry, _Failed):
            ep.queue.popleft()
            error = entry.error
            if entry.by_source and sys.version_info >= (3, 11):
                error.add_note(f"raised by the Prefetcher's source at batch {entry.index} (epoch {ep.number}); "
                               "the batches before it were yielded")
            raise error
        if isinstance(entry, _Copied):
            ep.queue.popleft()
            ep.yielded += 1
            return _fill(entry.template, [self._plain_copy(t) for t in entry.values])
        pipeline = self._pipeline
        assert pipeline is not None
        if slot_still_held(pipeline, entry.number, self.depth):
            raise RuntimeError(
                f"Prefetcher: batch {entry.index} goes into the device slot of batch {entry.index - self.depth}, "
                f"whose tensors are still alive; a batch is valid for {self.depth - 1} further next() calls: "
                ".clone() what you keep or raise depth")
        consumer = stream_handle(self.device, None)
        batch = pipeline.next(consumer)
        ep.queue.popleft()
        with batch:  # the tensors hold the batch on
            values = [self._tensor(batch, leaf) for leaf in entry.leaves]
        ep.yielded += 1
        if self.device.backend == "host":
            # The host backend's "kernels" are the caller's own CPU code: it reads the tensors at once.
            self.device._native.synchronize_stream(consumer)
        return _fill(entry.template, values)

    def _plain_copy(self, t: Any) -> Any:
        if self.device.backend == "host":
            return t.clone()  # a copy, as on a GPU: the source's memory is the loader's
        return t.to(f"cuda:{self.device.ordinal}")

    def _tensor(self, batch: _native.Batch, leaf: _Leaf) -> Any:
        return batch_tensor(batch, leaf.offset, leaf.shape, (leaf.code, leaf.bits, leaf.lanes), leaf.restore)

    # ---- the rest ------------------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """Counters and stage times: batches, bytes, h2d_gbps, pin_seconds, stages (fill, copy, ...)."""
        if self._pipeline is None:
            return {}
        return self._pipeline.stats()

    def close(self) -> None:
        """Stops ferry's threads; batches already yielded stay valid while their tensors live."""
        super().close()

    def _close(self) -> None:
        if self._pipeline is not None:
            self._pipeline.stop()
        if self._epoch is not None:
            self._epoch.queue.clear()

    def _finalize(self) -> None:
        # Joins the workers before the source tensors they may be copying are freed with this object; the
        # device slots stay valid while tensors made from them live.
        pipeline = self.__dict__.get("_pipeline")
        if pipeline is not None:
            pipeline.close()
