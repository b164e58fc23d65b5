"""ferry.torch.Loader: a multi-process loader whose worker processes write each sample straight into a
shared, pinned batch slot, which ferry's prefetcher copies to the GPU: no collate copy, no pin copy.

This file is the torch adapter: the Loader's arguments and DataLoader's conventions, its epochs, and the
batches as tensors. The machinery is framework-neutral and lives in ferry/_loader/ (engine.py: the slots
and the chunks of each batch; worker.py and processes.py: the worker processes; protocol.py: their
messages and Note [No chunk is lost]; order.py: the order and the seeds; layout.py: where a batch's bytes
lie in a slot); ferry/torch/_samples.py says how a torch sample is flattened and written; the native calls
are ferry/_native/loader.py's.
"""
from __future__ import annotations

import math
import os
import time
import warnings
import weakref
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple, Union

from .. import _runtime
from .._c import STATUS, ClosedError
from .._loader import processes
from .._loader.engine import Batch, Engine
from .._loader.order import Order, sample_seed
from .._loader.worker import WorkerInfo, worker_info
from .._template import fill
from .._loader.layout import PADDED, RAGGED
from ._batch import Padded, RaggedBatch, batch_tensor, crossing, slot_still_held
from ._common import DeviceLike, resolve_device, stream_handle
from .._loader.autoscale import Autoscale
from ._decode import ImageDecode, decoder_for, finish_images, resolved_decode
from ._samples import BOX, TorchSamples

__all__ = ["Loader", "Padded", "RaggedBatch", "WorkerInfo", "sample_seed", "worker_info"]


class _Epoch(Iterator[Any]):
    def __init__(self, owner: "Loader", number: int, batches: List[List[int]], k0: int) -> None:
        self.owner, self.number, self.batches, self.k0 = owner, number, batches, k0
        self.position = 0
        self.ended = False

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        return self.owner._next(self)

    def __len__(self) -> int:
        return len(self.batches)


def _is_iterable_dataset(dataset: Any) -> bool:
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return False
    return isinstance(dataset, IterableDataset)


def _rank_and_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    if rank is None and world_size is None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError(f"Loader(rank={rank!r}, world_size={world_size!r}): give both or neither")
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"Loader(rank={rank!r}, world_size={world_size!r}): expected 0 <= rank < world_size")
    return rank, world_size


class _Fixed:
    """A Loader attribute set once, by __init__: the workers, the order and the slots were made from it,
    so a later assignment is refused (ValueError, as DataLoader refuses batch_size, sampler, drop_last
    and dataset after its construction) instead of being silently ignored."""

    def __set_name__(self, owner: Any, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        try:
            return obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(f"'Loader' object has no attribute {self.name!r} (its __init__ failed)") from None

    def __set__(self, obj: Any, value: Any) -> None:
        if self.name in obj.__dict__:
            raise ValueError(f"Loader.{self.name} cannot be changed once the Loader is made (its workers, order "
                             "and slots follow it): make a new Loader")
        obj.__dict__[self.name] = value


class Loader:
    """Batches of `dataset` (any object with __len__ and __getitem__, a torch Dataset) as CUDA tensors,
    made by `workers` worker processes that write every sample straight into a shared, pinned batch slot,
    which ferry copies to the GPU on its own stream: the DataLoader(pin_memory=True) path without its two
    host copies (the collate into fresh shared memory, the pin thread's copy).

        loader = ferry.torch.Loader(dataset, batch_size=256, workers=8, shuffle=True, seed=0)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:   # CUDA tensors; the current stream waits for their copy
                ...

    Samples: dataset[i] (then `transform(sample)`, a per-sample function run in the worker) returns
    tensors, numpy arrays, numbers or byte strings, alone or in tuples, lists, dicts or namedtuples; a
    batch has the structure default_collate gives it (a tuple becomes a list; lists, dicts and
    namedtuples keep their type) with each leaf stacked along a new first dimension (numbers become
    int64, float64 or bool tensors). Every sample must have the first sample's shapes and dtypes: one
    that differs is refused naming its index, the field and both shapes. For images, return uint8 HWC or
    CHW and normalise on the GPU.

    Variable leaves (named by path, as the refusals print them: "sample[0]", "sample['ids']"):
    a bytes, bytearray or memoryview leaf, and a 1-D tensor or array named in `ragged`, is ragged: its
    batch element is a RaggedBatch (the samples' bytes in one flat uint8 tensor with int64 offsets and
    lengths). A tensor or array named in `pad` may vary in its leading dimension: its batch element is a
    Padded(data [B, L, ...], lengths int64[B]), L the batch's longest, the rows past a sample's length
    `pad_value` (what pad_sequence(batch_first=True) gives). `ragged` and `pad` take a path, paths, or a
    dict of path -> capacity (None: the default): a padded leaf's most rows a sample (default twice the
    first sample's, at least 16), a ragged leaf's bytes a sample on average over a group of 8 (default
    twice the first sample's bytes, at least 4096). A sample past its capacity grows the slots (they are
    laid out again with a capacity that admits it and the batch is made again), with one RuntimeWarning
    naming the sample and the ragged= or pad= to start with.

    Order and seeds: epoch e's order is a permutation seeded by (seed, e) when shuffle, else 0..n-1; with
    rank/world_size (default: torch.distributed's when it is initialized) each rank takes every
    world_size-th index of it, the order padded by wrapping to a multiple of world_size as
    DistributedSampler does. `sampler` (a torch Sampler, a DistributedSampler, any iterable of indices;
    not with shuffle, rank or world_size) gives the order instead, iterated in the main process at each
    epoch's start. Before each sample, random, numpy and torch are seeded with sample_seed(seed, epoch,
    index), so a batch's bytes do not depend on the worker count or timing (a worker seeds random and
    numpy lazily: one that the samples do not draw from is not seeded again, and a sample that drew from
    one left unseeded is made again with all seeded: ferry/torch/_samples.py). set_epoch(e) picks the next
    epoch's number (else they count up from 0) and calls the sampler's set_epoch(e) where it has one.
    drop_last drops a short final batch. dataset, batch_size, sampler, drop_last and the other
    construction arguments are attributes fixed at construction.

    Workers (`workers`, or DataLoader's name `num_workers`; 4 when neither is given) are started here and
    live until close() (persistent across epochs). workers="auto" starts one per core this process may
    use but one, and hands chunks to as many as the consumer needs: every 8 batches it measures the
    workers' seconds per batch and the consumer's own (ferry/_loader/autoscale.py), sets
    loader.workers_active to 1.25x their ratio (at least one more where next() still waited) and reports
    the choice and its history in stats()["autoscale"]; idle workers use no CPU. `start_method` None starts them as the program chose
    with multiprocessing.set_start_method(), as DataLoader does; where it chose none, forks them, as
    DataLoader does on Linux, also while other Python threads run; where fork is unsafe (macOS) or
    missing (Windows) they are spawned, with one warning saying so. Under "spawn" and "forkserver"
    (ferry preloads torch in the forkserver) each worker imports the main module again and gets the
    dataset, transform and worker_init_fn pickled: define them in an importable module and guard the
    script with `if __name__ == "__main__":`. Each worker runs worker_init_fn(id) first, with random,
    numpy and torch seeded by the worker's own seed; ferry.torch.worker_info() and
    torch.utils.data.get_worker_info() tell the dataset where it runs (get_worker_info().seed is that
    per-worker seed, fixed for the worker's life; worker_info().seed is the current sample's). Workers
    never touch CUDA. workers=0 makes the samples in the main process, in next(), into the same slots
    with the same seeds (the program's random, numpy and torch states are kept as they were), as
    DataLoader(num_workers=0) does for debugging: worker_info() and get_worker_info() are None there,
    worker_init_fn is not run, and a dataset's exception is raised as it is, with a note naming the
    sample.

    Faults: an exception in the dataset is raised by next() at its batch with the sample's index and the
    worker's traceback (the epoch then ends); one in worker_init_fn is raised by next() with the worker's
    id and traceback, and closes the loader; a worker that dies makes next() raise RuntimeError naming
    it and how it ended (its exit status or signal) at once; the loader is closed then. A batch not made
    within `timeout` seconds raises RuntimeError naming the workers that hold its samples (pid, state,
    positions), which print their Python stacks to stderr (one that never started, still importing the
    main module under spawn or forkserver, is named with the main-guard fix), and closes the loader.
    close() (also on `with`, `del` and interpreter exit) stops the workers (killing those that do not
    exit within a second) and frees the memory: the shared memory has no name, so nothing is left in
    /dev/shm whatever happens.

    JPEG datasets: decode=ferry.torch.ImageDecode(size, ...) takes a dataset that returns the encoded
    image (a file's bytes) and gives normalised, random-resized-cropped and flipped batches, decoded on
    the GPU by nvJPEG (where="device") or in the workers by libjpeg-turbo (where="cpu"); see ImageDecode.

    Lifetime of a batch: as ferry.torch.Prefetcher's: its device slot is reused `depth` batches later,
    so keep a batch for at most depth - 1 further next() calls (.clone() what you keep). On ferry's host
    backend (no GPU) the batches are CPU tensors."""

    dataset = _Fixed()
    batch_size = _Fixed()
    sampler = _Fixed()
    drop_last = _Fixed()
    shuffle = _Fixed()
    seed = _Fixed()
    workers = _Fixed()
    depth = _Fixed()
    slots = _Fixed()
    chunk = _Fixed()
    rank = _Fixed()
    world_size = _Fixed()
    start_method = _Fixed()
    decode = _Fixed()

    def __init__(self, dataset: Any, batch_size: int, *, workers: Optional[int] = None, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False, sampler: Optional[Iterable[Any]] = None, depth: int = 2,
                 device: DeviceLike = None, slots: Optional[int] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, transform: Optional[Callable[[Any], Any]] = None,
                 worker_init_fn: Optional[Callable[[int], None]] = None, start_method: Optional[str] = None,
                 chunk: Optional[int] = None, timeout: float = 300.0, num_workers: Optional[int] = None,
                 ragged: Variable = None, pad: Variable = None, pad_value: Any = 0,
                 decode: Optional[ImageDecode] = None) -> None:
        self._closed = True  # until the workers exist: close() and __del__ have nothing to do
        if workers is not None and num_workers is not None:
            raise ValueError(f"Loader(workers={workers!r}, num_workers={num_workers!r}): give one (num_workers is "
                             "DataLoader's name for workers)")
        workers_name = "workers" if num_workers is None else "num_workers"
        workers = num_workers if num_workers is not None else (4 if workers is None else workers)
        auto = isinstance(workers, str) and workers == "auto"
        if auto:  # one a core this process may use, but the main process's; Autoscale picks how many work
            workers = max(1, len(os.sched_getaffinity(0)) - 1) if hasattr(os, "sched_getaffinity") else \
                max(1, (os.cpu_count() or 2) - 1)
        for name, v, low in (("batch_size", batch_size, 1), (workers_name, workers, 0), ("depth", depth, 2)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"Loader({name}={v!r}): expected an integer >= {low}" + {
                    "depth": " (a for loop holds one batch while it asks for the next)",
                    workers_name: " (0: the samples are made in the main process), or 'auto'"}.get(name, ""))
        for name, v in (("slots", slots), ("chunk", chunk)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"Loader({name}={v!r}): expected an integer >= 1 or None")
        ragged_paths, ragged_caps = _variable("ragged", ragged)
        pad_paths, pad_caps = _variable("pad", pad)
        both = sorted(set(ragged_paths) & set(pad_paths))
        if both:
            raise ValueError(f"Loader(ragged=..., pad=...): {', '.join(both)} is in both; a leaf is one or the other")
        if not isinstance(pad_value, (int, float)) or isinstance(pad_value, bool):
            raise ValueError(f"Loader(pad_value={pad_value!r}): expected a number")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"Loader(seed={seed!r}): expected an integer")
        if decode is not None and not isinstance(decode, ImageDecode):
            raise TypeError(f"Loader(decode=a {type(decode).__name__}): expected a ferry.torch.ImageDecode")
        if decode is not None and decode.path in set(ragged_paths) | set(pad_paths):
            raise ValueError(f"Loader(decode=..., ragged/pad=...): {decode.path} is the image ImageDecode decodes; "
                             "leave it out of ragged and pad (ImageDecode(capacity=) sizes its bytes)")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"Loader(timeout={timeout!r}): expected a positive number of seconds")
        if _is_iterable_dataset(dataset) or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            what = "is an IterableDataset" if _is_iterable_dataset(dataset) else "has no __len__ and __getitem__"
            raise TypeError(f"Loader: a {type(dataset).__name__} {what}; a Loader reads a map-style dataset "
                            "(__len__ and __getitem__): for an iterable one use a DataLoader and "
                            "ferry.torch.Prefetcher")
        if sampler is not None:
            if shuffle:
                raise ValueError(f"Loader(sampler=a {type(sampler).__name__}, shuffle={shuffle!r}): sampler is "
                                 "mutually exclusive with shuffle (the sampler gives the order), as in DataLoader")
            if rank is not None or world_size is not None:
                raise ValueError(f"Loader(sampler=a {type(sampler).__name__}, rank={rank!r}, world_size="
                                 f"{world_size!r}): the sampler picks this rank's indices: give the rank and world "
                                 "size to it (DistributedSampler(dataset, num_replicas=, rank=)), not to the Loader")
            if not hasattr(sampler, "__iter__"):
                raise TypeError(f"Loader(sampler=a {type(sampler).__name__}): not iterable; a sampler yields "
                                "dataset indices (a torch Sampler, a range, a list)")
        n = len(dataset)
        if n < 1:
            raise ValueError("Loader: the dataset is empty")
        rank, world_size = _rank_and_world(rank, world_size) if sampler is None else (0, 1)
        if workers:
            method = processes.start_method(start_method)
        else:  # no worker process: no start method to choose (nor to warn about); one asked for is checked
            processes.checked_start_method(start_method)
            method = None
        self._pid = _runtime.current_pid()
        self.dataset, self.batch_size, self.workers, self.sampler = dataset, batch_size, workers, sampler
        self.shuffle, self.seed, self.drop_last, self.depth = bool(shuffle), seed, bool(drop_last), depth
        self.rank, self.world_size, self.start_method, self.timeout = rank, world_size, method, float(timeout)
        self.slots = slots if slots is not None else depth + min(16, max(2, math.ceil(2 * workers * 8 / batch_size)))
        self.chunk = chunk if chunk is not None else max(1, min(16, math.ceil(batch_size / (2 * max(workers, 1)))))
        # Samples of at most 4 KiB: up to 64 a chunk (the messages per batch cost more than such samples).
        small_chunk = None if chunk is not None else max(1, min(64, math.ceil(batch_size / (2 * max(workers, 1)))))
        self.ragged, self.pad, self.pad_value = ragged_paths, pad_paths, pad_value
        self.device: Any = None  # resolved after the workers start: ferry's device starts threads
        self._order = Order(dataset, batch_size, shuffle=self.shuffle, seed=seed, drop_last=self.drop_last, rank=rank,
                            world_size=world_size, sampler=sampler)
        self._next_epoch: Optional[int] = None
        self._epochs_started = 0
        self._epoch_ref: Optional["weakref.ref[_Epoch]"] = None  # the current epoch (not kept alive by it)
        self._crossing: List[Tuple[Tuple[int, int, int], Optional[Tuple[Any, Tuple[int, ...]]]]] = []
        self._int64 = self._uint8 = (0, 0, 0)  # DLPack's codes of the lengths and of a ragged slab
        self._engine: Optional[Engine] = None
        self._autoscale: Optional[Autoscale] = None
        self.decode = decode
        self._decode = resolved_decode(decode, device)  # where "auto" chose (before the workers start)
        self._decoder: Any = None  # the nvJPEG decoder of where="device"
        if self._decode is not None and self._decode.where == "device":
            if decode.capacity is not None:  # else the ragged default (ferry/_loader/layout.py)
                ragged_caps = {**ragged_caps, decode.path: decode.capacity}
        self._closed = False
        _runtime.register(self)
        try:
            self._engine = Engine(dataset=dataset, transform=transform,
                                  fmt=TorchSamples(ragged_paths, pad_paths, pad_value, self._decode),
                                  batch_size=batch_size,
                                  seed=seed, depth=depth, slots=self.slots, chunk=self.chunk, timeout=self.timeout,
                                  start_method=method, on_fail=_closer(self), capacity={**ragged_caps, **pad_caps},
                                  small_chunk=small_chunk)
            self._engine.start_workers(workers, worker_init_fn,
                                       preload=("torch", "ferry._loader.worker", TorchSamples.__module__))
            self._autoscale = Autoscale(self._engine, batch_size, workers) if auto else None
            self.device = resolve_device(device)
            if self._decode is not None:
                self._decoder = decoder_for(self._decode, self.device)
                # A device decode reads batch k's bytes in its host slot after the copy: the slot is handed
                # to the workers again only once that read is done (Engine.hold).
                self._engine.hold_until_taken = self._decoder is not None
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        """DataLoader's name for `workers`."""
        return self.workers

    @property
    def _mm(self) -> Any:
        """The main process's mapping of the slots (None before the first epoch)."""
        return self._engine.mapping if self._engine is not None else None

    def __len__(self) -> int:
        """Batches per epoch on this rank (with a sampler: of len(sampler) indices)."""
        return len(self._order)

    def __bool__(self) -> bool:
        return True

    def set_epoch(self, epoch: int) -> None:
        """The number of the next epoch (its shuffle and its samples' seeds), as DistributedSampler's; a
        sampler with a set_epoch (a DistributedSampler) gets it too."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"Loader.set_epoch({epoch!r}): expected an integer >= 0")
        self._next_epoch = epoch
        self._order.set_epoch(epoch)

    # ---- epochs -----------------------------------------------------------------------------------

    @property
    def _epoch(self) -> Optional[_Epoch]:
        return self._epoch_ref() if self._epoch_ref is not None else None

    def __iter__(self) -> Iterator[Any]:
        """A new epoch (see the class)."""
        self._check_usable("__iter__")
        engine = self._engine
        assert engine is not None
        number = self._next_epoch if self._next_epoch is not None else self._epochs_started
        self._next_epoch = None
        self._epochs_started = number + 1
        old = self._epoch
        if old is not None:
            old.ended = True
        batches = self._order.batches(number)
        if not engine.set_up_done:
            if not batches:
                self._epoch_ref = None
                return iter(())
            engine.set_up(self.device._native, batches[0][0], number)
            self._crossing = []
            for leaf in engine.layout.leaves:
                _, info, restore = crossing(leaf.path, _empty(leaf.dtype))
                self._crossing.append(((info.code, info.bits, info.lanes), restore))
            _, info, _ = crossing("lengths", _empty(_int64()))
            self._int64 = (info.code, info.bits, info.lanes)
            _, info, _ = crossing("bytes", _empty(_uint8()))
            self._uint8 = (info.code, info.bits, info.lanes)
        elif engine.left_part_way():
            engine.new_pipeline()  # the previous epoch was left part-way
        # A batch never dispatched was never written: the epoch starts at the first of them.
        ep = _Epoch(self, number, batches, engine.dispatch_next)
        self._epoch_ref = weakref.ref(ep)
        engine.plan(ep.k0, number, batches)
        return ep

    def _check_usable(self, what: str) -> None:
        _runtime.check_owner(self, self._pid)
        failure = self._engine.failure if self._engine is not None else None
        if failure is not None:
            raise RuntimeError(f"Loader.{what}: the loader failed earlier ({failure})")
        if self._closed:
            raise ClosedError(f"Loader.{what}: the Loader is closed", STATUS["FERRY_ERROR_STOPPED"])

    def _next(self, ep: _Epoch) -> Any:
        self._check_usable("__next__")
        if ep is not self._epoch or ep.ended:
            if ep is not self._epoch:
                raise RuntimeError("Loader: this epoch was abandoned when a newer one started (a Loader runs one "
                                   "epoch at a time)")
            raise StopIteration
        if ep.position >= len(ep.batches):
            ep.ended = True
            raise StopIteration
        engine = self._engine
        assert engine is not None and engine.prefetcher is not None
        k = ep.k0 + ep.position
        # Before anything changes: a refused next() changes nothing.
        if slot_still_held(engine.prefetcher, k, self.depth):
            raise RuntimeError(
                f"Loader: the next batch goes into the device slot of the batch {self.depth} before it, whose "
                f"tensors are still alive; a batch is valid for {self.depth - 1} further next() calls: .clone() "
                "what you keep (list(loader) keeps every batch) or raise depth")
        t0 = time.perf_counter() if self._autoscale is not None else 0.0
        batch = engine.pump(k)
        while batch.grow is not None and batch.error is None:
            # A sample past a variable leaf's capacity: the slots are laid out again and the epoch goes on
            # from this batch in a new pipeline, whose numbers start at 0.
            path, argument, capacity, text, _ = batch.grow
            engine.grow(path, capacity)
            warnings.warn(f"ferry Loader: {text}. The slots are laid out again with {argument}={{{path!r}: "
                          f"{capacity}}} ({engine.layout.slot_bytes} bytes a slot); give it to the Loader to start "
                          "there", RuntimeWarning, stacklevel=3)
            ep.k0 = -ep.position
            engine.plan(ep.k0, ep.number, ep.batches)
            batch = engine.pump(0)
        k = ep.k0 + ep.position
        if batch.error is not None:
            ep.ended = True
            error, batch.error = batch.error, None
            raise error
        waited = time.perf_counter() - t0 if self._autoscale is not None else 0.0  # for the workers alone
        try:
            out = self._take(batch)
        except BaseException:
            # The batch was taken from the prefetcher (a decode failed after it): it is gone, and so is the
            # epoch, which the next iter() starts in a new pipeline (batches and their slots stay in step).
            ep.ended = True
            ep.position += 1
            del engine.batches[k]
            raise
        ep.position += 1
        del engine.batches[k]
        if self._autoscale is not None:
            if ep.position == 1:
                self._autoscale.new_epoch()
            self._autoscale.taken(waited)
        return out

    # ---- the batch on the device ---------------------------------------------------------------------

    def _take(self, b: Batch) -> Any:
        """Batch b on the device: taken from ferry's prefetcher (which hands batches out in order)."""
        engine = self._engine
        assert engine is not None and engine.prefetcher is not None and engine.layout is not None
        consumer = stream_handle(self.device, None)
        n = len(b.items)
        lay = engine.layout
        lent = engine.prefetcher.next(consumer)
        try:
            engine.taken += 1
            values = []
            for f, (leaf, base, (dtype, restore)) in enumerate(zip(lay.leaves, lay.offsets, self._crossing)):
                if leaf.kind == RAGGED:
                    values.append(RaggedBatch(
                        batch_tensor(lent, base, (n * leaf.nbytes,), self._uint8, None),
                        batch_tensor(lent, lay.starts[f], (n,), self._int64, None),
                        batch_tensor(lent, lay.lengths[f], (n,), self._int64, None), leaf.dtype))
                    continue
                shape = (n, *leaf.shape)
                t = batch_tensor(lent, base, shape if restore is None else (n * leaf.nbytes,), dtype,
                                 None if restore is None else (restore[0], shape))
                if leaf.kind == PADDED:
                    t = Padded(t[:, :b.longest.get(f, 0)], batch_tensor(lent, lay.lengths[f], (n,), self._int64, None))
                values.append(t)
        finally:
            lent.close()
        if self.device.backend == "host":  # the host backend's batch is read by the CPU, now: its copy first
            self.device._native.synchronize_stream(consumer)
        if self._decode is not None:
            finish_images(self._decode, self._decoder, engine, b, values, consumer)
        return fill(engine.template, values)

    # ---- the rest ------------------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The workers' counters (samples, bytes: the samples' bytes written into slots, seconds and CPU
        seconds in the dataset and the write, write_seconds: the part of seconds spent writing into the
        slots, counted per chunk where the fast path writes a chunk at its end) and the
        prefetcher's (batches, bytes copied, h2d_gbps, stages; copies are counted once complete, all of
        them after close(); since the last new pipeline, which an epoch left part-way starts)."""
        if self._engine is None:
            return {"slots": self.slots, "slot_bytes": 0, "workers": []}
        out = self._engine.stats()
        if self._autoscale is not None:
            out["autoscale"] = self._autoscale.stats()
        return out

    @property
    def workers_active(self) -> int:
        """How many of the workers get chunks now: all of them, but with workers="auto" (see stats())."""
        return self._engine.active if self._engine is not None else 0

    def close(self) -> None:
        """Stops the workers (SIGKILL for any that has not exited within a second), the prefetcher, and
        frees the shared memory. Batches already yielded stay valid while their tensors live. Idempotent."""
        if getattr(self, "_closed", True) or self._pid != _runtime.current_pid():
            return
        self._closed = True
        try:
            if self._engine is not None:
                self._engine.close()  # waits the holds: nvJPEG no longer reads the slots
            if self._decoder is not None:
                self._decoder.close()
        finally:
            ep = self._epoch
            if ep is not None:
                ep.ended = True

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection time
            pass


def _closer(loader: Loader) -> Callable[[BaseException], None]:
    """What the engine calls when the loader fails: close it (a weak reference: `del loader` frees it)."""
    ref = weakref.ref(loader)

    def close(error: BaseException) -> None:
        owner = ref()
        if owner is not None:
            owner.close()
    return close


def _empty(dtype: Any) -> Any:
    import torch
    return torch.empty((0,), dtype=dtype)


def _uint8() -> Any:
    import torch
    return torch.uint8


def _int64() -> Any:
    import torch
    return torch.int64


Variable = Union[None, str, Iterable[str], Dict[str, Optional[int]]]


def _variable(name: str, value: Variable) -> Tuple[FrozenSet[str], Dict[str, int]]:
    """Loader(ragged=...) or (pad=...): a path, paths, or a dict of path -> capacity (None: the default);
    the paths and the capacities given."""
    if value is None:
        return frozenset(), {}
    if isinstance(value, str):
        value = (value,)
    caps: Dict[str, int] = {}
    if isinstance(value, dict):
        for path, cap in value.items():
            if not isinstance(path, str):
                raise ValueError(f"Loader({name}={value!r}): the keys are leaf paths such as 'sample[0]'")
            if cap is not None:
                if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
                    raise ValueError(f"Loader({name}={{{path!r}: {cap!r}}}): a capacity is an integer >= 1 ("
                                     + ("bytes a sample, on average over a chunk" if name == "ragged" else
                                        "the most rows of a sample") + ") or None for the default")
                caps[path] = cap
        return frozenset(value), caps
    try:
        paths = list(value)
    except TypeError:
        raise ValueError(f"Loader({name}={value!r}): expected a leaf path such as 'sample[0]', paths, or a dict of "
                         "path -> capacity") from None
    if not all(isinstance(p, str) for p in paths):
        raise ValueError(f"Loader({name}={value!r}): the leaves are named by paths such as 'sample[0]'")
    return frozenset(paths), {}
