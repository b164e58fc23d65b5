"""ferry.torch.Loader: a multi-process loader whose worker processes write each sample straight into a
shared, pinned batch slot, which ferry's prefetcher copies to the GPU: no collate copy, no pin copy.

Memory. One memfd (an anonymous shared-memory file: no name under /dev/shm, nothing to leak, not bound by
/dev/shm's size) holds `slots` batch slots. The main process maps it and registers the mapping with the
driver once (ferry_prefetch_create_slots: cudaHostRegister, verified; the host backend locks it); the
workers map the same file and write into the same physical pages, so the copy engine reads what they
wrote. Workers never touch CUDA. In a slot, leaf f of the samples (a tensor, an array or a number of the
sample's structure) occupies batch_size * its bytes from a 256-aligned offset, sample j at j * its bytes.

Work. Batch k (counted across epochs) lives in slot k % slots. The main process hands a batch's samples to
the workers in chunks once ferry says its slot is writable (the batch `slots` before it reached the
device), at most two chunks per worker at a time, so every worker helps with the oldest batch; a worker
writes a chunk and answers with one short message. All of it runs in next() on the caller's thread: the
main process never touches a batch's bytes.

With workers=0 the main process makes each batch's samples in next() and writes them into the same
slots itself, with the same seeds.

Messages (multiprocessing pipes, pickled tuples). To a worker: ("probe", index, seed, epoch),
("layout", fd_size, leaves), ("chunk", k, slot_offset, [(position, index), ...], epoch), or None
(exit). From a worker: ("ready",) first (it got past its start: the unpickling and, under spawn or
forkserver, the main module's import) | ("spec", template, leaves) | ("done", k, samples, bytes, seconds,
write_seconds, cpu_seconds) | ("error", k, position, index, type module, type name, message, traceback text).
"""
from __future__ import annotations

import collections
import contextlib
import gc
import math
import mmap
import multiprocessing
import multiprocessing.connection
import operator
import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from ctypes import byref, c_char, c_int, c_int64, c_uint64, c_void_p, addressof
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from .. import _runtime
from .._c import STATUS, BatchHandle, ClosedError, PrefetchHandle, check, lib
from ._common import DeviceLike, resolve_device, stream_handle
from ._prefetch import _Slot, _crossing, _fill, batch_tensor, slot_still_held

_ALIGN = 256
_PAGE = mmap.PAGESIZE
_MASK = (1 << 64) - 1
_MAX_OUTSTANDING = 2  # chunks a worker holds at once
_INIT = -2  # the batch number of an error message from worker_init_fn


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of dataset index `index` in epoch `epoch` of a loader seeded `seed`: the same whichever
    worker runs it, however many workers there are (ferry's C++ loader's sample_seed)."""
    return _mix64((_mix64((_mix64(seed & _MASK) + epoch) & _MASK) + index) & _MASK)


def _worker_seed(seed: int, wid: int) -> int:
    """Worker `wid`'s own seed: what random, numpy and torch hold while worker_init_fn runs, and the `seed`
    of torch.utils.data.get_worker_info() there (DataLoader's per-worker base seed); fixed for the
    worker's life, while each sample is made under its own sample_seed. Below 2**63, as DataLoader's (an
    int64 holds it)."""
    return _mix64(((_mix64(seed & _MASK) ^ 0x776F726B6572) + wid) & _MASK) >> 1  # "worker": apart from sample seeds


class WorkerInfo(NamedTuple):
    """What ferry.torch.worker_info() tells a Dataset inside a Loader worker."""
    id: int
    workers: int
    seed: int  # the seed of the sample being made (also set in random, numpy and torch)
    dataset: Any


_worker: Optional[Dict[str, Any]] = None  # set in a worker process


def worker_info() -> Optional[WorkerInfo]:
    """In a ferry.torch.Loader worker process: its id, the number of workers, the current sample's seed
    (in worker_init_fn: the worker's own seed) and the dataset; None elsewhere, the main process of a
    Loader(workers=0) included (as torch.utils.data.get_worker_info)."""
    if _worker is None:
        return None
    return WorkerInfo(_worker["id"], _worker["workers"], _worker["seed"], _worker["dataset"])


def _set_torch_worker_info(wid: int, workers: int, seed: int, dataset: Any) -> None:
    """Makes torch.utils.data.get_worker_info() answer in this worker, as in a DataLoader's: datasets
    shard or open their files by it. It reads torch.utils.data._utils.worker._worker_info, a WorkerInfo
    made from keywords (torch 1.13: frozen after __init__; 2.x: a frozen dataclass whose other fields
    have defaults). A torch whose WorkerInfo takes other arguments leaves it None."""
    try:
        from torch.utils.data._utils import worker as torch_worker
        info = torch_worker.WorkerInfo(id=wid, num_workers=workers, seed=seed, dataset=dataset)
    except (ImportError, AttributeError, TypeError):
        return
    torch_worker._worker_info = info


def _seed_all(seed: int) -> None:
    import numpy as np
    import torch
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    # The CPU generator only: torch.manual_seed also queues a CUDA seeding, with a formatted stack
    # (torch 1.13), in a process that never initializes CUDA: slow per sample.
    torch.default_generator.manual_seed(seed)


def _make(dataset: Any, transform: Optional[Callable[[Any], Any]], index: int, seed: int) -> Any:
    """Sample `index`, made with random, numpy and torch seeded by `seed`."""
    if _worker is not None:
        _worker["seed"] = seed
    _seed_all(seed)
    sample = dataset[index]
    return transform(sample) if transform is not None else sample


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """The main process's random, numpy and torch CPU generator states, as they were, after the block: a
    Loader(workers=0) seeds them per sample as a worker does, without changing the program's streams."""
    import numpy as np
    import torch
    states = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.default_generator.set_state(states[2])


def _note(e: BaseException, text: str) -> None:
    """Adds `text` to an exception raised as it is (Python >= 3.11 shows notes under the message)."""
    if hasattr(e, "add_note"):
        e.add_note(text)


# ---- samples: flattening into leaves -------------------------------------------------------------------

class _Leaf(NamedTuple):
    path: str
    dtype: Any  # torch.dtype
    shape: Tuple[int, ...]
    nbytes: int


def _leaves_of(obj: Any, path: str, out: List[Tuple[str, Any]]) -> Any:
    """A template of a batch of such samples (tensors, numpy arrays and numbers in tuples, lists, dicts
    and namedtuples) with each leaf replaced by its index in `out`; the leaves as tensors. The batch's
    structure is default_collate's: a tuple becomes a list; lists, dicts and namedtuples keep their type."""
    import numpy as np
    import torch
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
    elif isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError(f"{path} is a numpy array of Python objects; a slot holds numbers")
        out.append((path, _array_tensor(obj)))
    elif isinstance(obj, np.generic):
        out.append((path, torch.from_numpy(np.asarray(obj).reshape(()).copy())))
    elif isinstance(obj, bool):
        out.append((path, torch.tensor(obj, dtype=torch.bool)))
    elif isinstance(obj, int):
        out.append((path, torch.tensor(obj, dtype=torch.int64)))
    elif isinstance(obj, float):
        out.append((path, torch.tensor(obj, dtype=torch.float64)))
    elif isinstance(obj, dict):
        return type(obj)((k, _leaves_of(v, f"{path}[{k!r}]", out)) for k, v in obj.items())
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_leaves_of(v, f"{path}.{f}", out) for f, v in zip(obj._fields, obj)))
    elif isinstance(obj, tuple):
        # A list, as default_collate makes of a tuple (code that assigns into the batch relies on it).
        return [_leaves_of(v, f"{path}[{i}]", out) for i, v in enumerate(obj)]
    elif isinstance(obj, list):
        return type(obj)(_leaves_of(v, f"{path}[{i}]", out) for i, v in enumerate(obj))
    else:
        raise TypeError(f"{path} is a {type(obj).__name__}; a Loader sample holds tensors, numpy arrays and "
                        "numbers (in tuples, lists, dicts or namedtuples): turn it into one in the dataset or "
                        "transform")
    return _Slot(len(out) - 1)


def _array_tensor(a: Any) -> Any:
    """A tensor over an array's memory, strided or read-only, without copying it (the Loader only reads
    it); an array with negative strides (a flipped view) is copied once, as torch cannot view it."""
    import numpy as np
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only: ferry only reads it
        try:
            return torch.from_numpy(a)
        except ValueError:
            return torch.from_numpy(np.ascontiguousarray(a))


def _shape_text(dtype: Any, shape: Sequence[int]) -> str:
    return f"{str(dtype).replace('torch.', '')}[{', '.join(map(str, shape))}]"


# ---- the worker process ----------------------------------------------------------------------------------

class _Fd:
    """A file descriptor for a worker: inherited as it is under fork, duplicated into the child under
    spawn and forkserver (multiprocessing's DupFd, as its Connection objects cross)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        from multiprocessing import reduction
        return _rebuild_fd, (reduction.DupFd(self.fd),)


def _rebuild_fd(dup: Any) -> "_Fd":
    return _Fd(dup.detach())


def _die_with_parent(parent: Optional[int]) -> None:
    """SIGKILL this worker when the process that started it dies (Linux), and exit now if it already has
    (`parent` None: a forkserver's child, or started from a thread other than the main one, whose exit
    would fire the signal: the worker then ends at EOF on its task pipe)."""
    if parent is None:
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def _worker_main(wid: int, workers: int, seed_root: int, dataset: Any,
                 transform: Optional[Callable[[Any], Any]],
                 worker_init_fn: Optional[Callable[[int], None]], memfd: _Fd, tasks: Any, results: Any,
                 parent: Optional[int], collect: bool) -> None:
    global _worker
    # What the worker inherited is the parent's: a garbage collection here must not run its finalizers
    # (a parent's ferry or CUDA object freed in a fork child can wait forever on a lock that one of the
    # parent's threads held at the fork). The parent forks with the collector off (so none runs in the
    # child before this line); frozen objects are never collected, nor written by the collector (their
    # pages stay shared with the parent). `collect`: whether the parent had it on.
    gc.disable()
    gc.freeze()
    if collect:
        gc.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _die_with_parent(parent)
    try:
        results.send(("ready",))
    except OSError:
        return  # the main process is gone
    # SIGUSR1 prints this worker's Python stack to stderr: the main process sends it to the workers that
    # hold a batch past the timeout, so that a stuck dataset (or worker) shows where it is; a crash
    # (SIGSEGV in a dataset's native code) prints it too.
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.enable(all_threads=True)
    import torch
    torch.set_num_threads(1)
    own_seed = _worker_seed(seed_root, wid)
    _worker = {"id": wid, "workers": workers, "seed": own_seed, "dataset": dataset}
    _set_torch_worker_info(wid, workers, own_seed, dataset)
    _seed_all(own_seed)  # as a DataLoader's worker is seeded before its worker_init_fn
    base = 0  # the address of the slots in this worker
    mm: Optional[mmap.mmap] = None
    leaves: List[_Leaf] = []
    offsets: List[int] = []

    def make(index: int, seed: int) -> Any:
        return _make(dataset, transform, index, seed)

    try:
        if worker_init_fn is not None:
            try:
                worker_init_fn(wid)
            except Exception as e:  # noqa: BLE001 - the main process raises it, then the worker exits
                results.send(_error_message(_INIT, 0, -1, e))
                return
        while True:
            try:
                msg = tasks.recv()
            except (EOFError, OSError):
                return  # the main process closed the pipe or died
            if msg is None:
                return
            kind = msg[0]
            if kind == "probe":
                _, index, seed, epoch = msg
                try:
                    flat: List[Tuple[str, Any]] = []
                    template = _leaves_of(make(index, seed), "sample", flat)
                    spec = [(p, t.dtype, tuple(t.shape)) for p, t in flat]
                    results.send(("spec", template, spec))
                except Exception as e:  # noqa: BLE001 - the main process raises it
                    results.send(_error_message(-1, 0, index, e))
            elif kind == "layout":
                _, size, leaves_, offsets_ = msg
                leaves, offsets = leaves_, offsets_
                # Populated now: the first write to each page would otherwise fault in every worker, in
                # the first batches (about 1 us a page, 10 ms a 38 MB batch).
                if mm is not None:
                    mm.close()
                mm = mmap.mmap(memfd.fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
                anchor = c_char.from_buffer(mm)  # an export of the buffer, dropped at once: mm can close
                base = addressof(anchor)
                del anchor
            elif kind == "chunk":
                _, k, slot_offset, items, epoch = msg
                assert mm is not None
                t0, c0 = time.perf_counter(), time.process_time()
                written, writing = 0, 0.0
                failed = False
                for position, index in items:
                    try:
                        sample = make(index, sample_seed(seed_root, epoch, index))
                        w0 = time.perf_counter()
                        written += _write_sample(sample, index, position, base + slot_offset, leaves, offsets)
                        writing += time.perf_counter() - w0
                    except Exception as e:  # noqa: BLE001 - raised in the main process at this batch
                        results.send(_error_message(k, position, index, e))
                        failed = True
                        break
                if not failed:
                    results.send(("done", k, len(items), written, time.perf_counter() - t0, writing,
                                  time.process_time() - c0))
    finally:
        if mm is not None:
            mm.close()


def _error_message(k: int, position: int, index: int, e: BaseException) -> Tuple[Any, ...]:
    return ("error", k, position, index, type(e).__module__, type(e).__qualname__, str(e),
            "".join(traceback.format_exception(type(e), e, e.__traceback__)))


def _write_sample(sample: Any, index: int, position: int, slot: int, leaves: List[_Leaf], offsets: List[int]) -> int:
    """Writes one sample's leaves into their places in the slot at address `slot`: the one copy of its
    bytes, gathered from any strides (a channels-first view of an image's channels-last bytes is a
    vectorized deinterleave: ferry_copy_strided)."""
    import torch
    flat: List[Tuple[str, Any]] = []
    _leaves_of(sample, "sample", flat)
    if len(flat) != len(leaves):
        raise ValueError(f"sample {index} has {len(flat)} tensors ({', '.join(p for p, _ in flat)}); the first "
                         f"sample had {len(leaves)} ({', '.join(leaf.path for leaf in leaves)}): every sample "
                         "of a Loader has the same structure")
    written = 0
    for (path, t), leaf, base in zip(flat, leaves, offsets):
        if t.dtype != leaf.dtype or tuple(t.shape) != leaf.shape:
            raise ValueError(
                f"sample {index}: {path} is {_shape_text(t.dtype, t.shape)}; the first sample's was "
                f"{_shape_text(leaf.dtype, leaf.shape)}. A Loader batch holds samples of one shape and dtype: "
                "resize, crop or pad them to one shape in the dataset or transform (variable-size samples: a "
                "DataLoader with a collate_fn that pads, and ferry.torch.Prefetcher(batch_bytes=the largest))")
        if leaf.nbytes == 0:
            continue
        src = t.detach()
        if src.device.type != "cpu" or src.layout != torch.strided or src.is_quantized:
            raise ValueError(f"sample {index}: {path} is a {src.device.type} tensor of layout {src.layout}"
                             f"{' (quantized)' if src.is_quantized else ''}; a Loader worker writes dense CPU "
                             "tensors: return CPU tensors or arrays from the dataset")
        if src.is_conj() or src.is_neg():  # lazy conjugate or negation: the stored bytes are not the values
            src = src.resolve_conj().resolve_neg()
        item = src.element_size()
        ndim = src.dim()
        check(lib.ferry_copy_strided(slot + base + position * leaf.nbytes, src.data_ptr(), ndim,
                                     (c_int64 * ndim)(*src.shape), (c_int64 * ndim)(*(s * item for s in src.stride())),
                                     item))
        written += leaf.nbytes
    return written


# ---- the main process ----------------------------------------------------------------------------------

class _Worker:
    __slots__ = ("id", "pid", "process", "tasks", "results", "outstanding", "samples", "bytes", "seconds",
                 "cpu_seconds", "write_seconds", "started")

    def __init__(self, wid: int, process: Any, tasks: Any, results: Any) -> None:
        self.id, self.process, self.tasks, self.results = wid, process, tasks, results
        self.pid: int = process.pid
        self.outstanding: Deque[Tuple[int, List[Tuple[int, int]]]] = collections.deque()
        self.samples = self.bytes = 0
        self.seconds = self.cpu_seconds = self.write_seconds = 0.0
        self.started = False  # its ("ready",) was read: it got past unpickling and the main module's import


class _Batch:
    __slots__ = ("k", "epoch", "number", "items", "pending", "left", "error", "readied")

    def __init__(self, k: int, epoch: int, number: int, items: List[Tuple[int, int]]) -> None:
        self.k, self.epoch, self.number, self.items = k, epoch, number, items
        self.pending: Deque[List[Tuple[int, int]]] = collections.deque()
        self.left = len(items)
        self.error: Optional[BaseException] = None
        self.readied = False


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
    tensors, numpy arrays or numbers, alone or in tuples, lists, dicts or namedtuples; a batch has the
    structure default_collate gives it (a tuple becomes a list; lists, dicts and namedtuples keep their
    type) with each leaf stacked along a new first dimension (numbers become int64, float64 or bool
    tensors). Every sample must have the first sample's shapes and dtypes: one that differs is refused
    naming its index, the field and both shapes. For images, return uint8 HWC or CHW and normalise on
    the GPU.

    Order and seeds: epoch e's order is a permutation seeded by (seed, e) when shuffle, else 0..n-1; with
    rank/world_size (default: torch.distributed's when it is initialized) each rank takes every
    world_size-th index of it, the order padded by wrapping to a multiple of world_size as
    DistributedSampler does. `sampler` (a torch Sampler, a DistributedSampler, any iterable of indices;
    not with shuffle, rank or world_size) gives the order instead, iterated in the main process at each
    epoch's start. Before each sample, random, numpy and torch are seeded with sample_seed(seed, epoch,
    index), so a batch's bytes do not depend on the worker count or timing. set_epoch(e) picks the next
    epoch's number (else they count up from 0) and calls the sampler's set_epoch(e) where it has one.
    drop_last drops a short final batch. dataset, batch_size, sampler, drop_last and the other
    construction arguments are attributes fixed at construction.

    Workers (`workers`, or DataLoader's name `num_workers`; 4 when neither is given) are started here and
    live until close() (persistent across epochs). `start_method` None starts them as the program chose
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

    def __init__(self, dataset: Any, batch_size: int, *, workers: Optional[int] = None, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False, sampler: Optional[Iterable[Any]] = None, depth: int = 2,
                 device: DeviceLike = None, slots: Optional[int] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, transform: Optional[Callable[[Any], Any]] = None,
                 worker_init_fn: Optional[Callable[[int], None]] = None, start_method: Optional[str] = None,
                 chunk: Optional[int] = None, timeout: float = 300.0, num_workers: Optional[int] = None) -> None:
        self._closed = True  # until the workers exist: close() and __del__ have nothing to do
        if workers is not None and num_workers is not None:
            raise ValueError(f"Loader(workers={workers!r}, num_workers={num_workers!r}): give one (num_workers is "
                             "DataLoader's name for workers)")
        workers_name = "workers" if num_workers is None else "num_workers"
        workers = num_workers if num_workers is not None else (4 if workers is None else workers)
        for name, v, low in (("batch_size", batch_size, 1), (workers_name, workers, 0), ("depth", depth, 2)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"Loader({name}={v!r}): expected an integer >= {low}" + {
                    "depth": " (a for loop holds one batch while it asks for the next)",
                    workers_name: " (0: the samples are made in the main process)"}.get(name, ""))
        for name, v in (("slots", slots), ("chunk", chunk)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"Loader({name}={v!r}): expected an integer >= 1 or None")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"Loader(seed={seed!r}): expected an integer")
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
            method = _start_method(start_method)
        else:  # no worker process: no start method to choose (nor to warn about); one asked for is checked
            _checked_start_method(start_method)
            method = None
        self._pid = _runtime.current_pid()
        self.dataset, self.batch_size, self.workers, self.sampler = dataset, batch_size, workers, sampler
        self.shuffle, self.seed, self.drop_last, self.depth = bool(shuffle), seed, bool(drop_last), depth
        self.rank, self.world_size, self.start_method, self.timeout = rank, world_size, method, float(timeout)
        self.slots = slots if slots is not None else depth + min(16, max(2, math.ceil(2 * workers * 8 / batch_size)))
        self.chunk = chunk if chunk is not None else max(1, min(16, math.ceil(batch_size / (2 * max(workers, 1)))))
        self.device: Any = None  # resolved after the workers start: ferry's device starts threads
        self._transform = transform  # for workers=0; the workers get their own
        self._length = math.ceil(n / world_size)  # indices per epoch for this rank (without a sampler)
        self._next_epoch: Optional[int] = None
        self._epochs_started = 0
        self._epoch_ref: Optional["weakref.ref[_Epoch]"] = None  # the current epoch (not kept alive by it)
        # Batches are numbered across epochs as ferry's slot feed counts them (batch k in slot k % slots).
        self._batches: Dict[int, _Batch] = {}  # dispatched and not yet taken
        self._pending: Deque[_Batch] = collections.deque()  # dispatched with chunks not yet sent, in order
        self._probes = self._probe_replies = 0  # first-sample requests sent to worker 0, replies read
        self._dispatch_next = 0  # the next batch to dispatch
        self._taken = 0  # batches taken from ferry's prefetcher (in order)
        self._dispatch_end = 0  # the end of the current epoch's batches
        self._plan_k0, self._plan_epoch = 0, 0
        self._plan_batches: List[List[int]] = []  # the current epoch's dataset indices, per batch
        self._handle: Optional[PrefetchHandle] = None
        self._mm: Optional[_SharedMapping] = None
        self._anchor: Optional[Any] = None  # the ctypes view whose address was registered
        self._memfd = -1
        self._event_fd = -1
        self._leaves: List[_Leaf] = []
        self._offsets: List[int] = []
        self._crossing: List[Tuple[Tuple[int, int, int], Optional[Tuple[Any, Tuple[int, ...]]]]] = []
        self._template: Any = None
        self._slot_bytes = 0
        self._failure: Optional[BaseException] = None
        self._final_prefetch: Optional[Dict[str, Any]] = None
        self._workers: List[_Worker] = []
        self._memfd = os.memfd_create("ferry-loader", os.MFD_CLOEXEC)
        self._closed = False
        _runtime.register(self)
        try:
            self._start_workers(transform, worker_init_fn)
            self.device = resolve_device(device)
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        """DataLoader's name for `workers`."""
        return self.workers

    # ---- order ------------------------------------------------------------------------------------

    def _shard(self, epoch: int) -> List[int]:
        n = len(self.dataset)
        if self.sampler is not None:
            return [_sampled_index(i, position, n) for position, i in enumerate(self.sampler)]
        if self.shuffle:
            import numpy as np
            order = np.random.default_rng([self.seed & _MASK, epoch]).permutation(n).tolist()
        else:
            order = list(range(n))
        if self.world_size > 1:
            total = math.ceil(n / self.world_size) * self.world_size
            order += (order * math.ceil(total / n))[:total - n]  # pad by wrapping, as DistributedSampler
            order = order[self.rank::self.world_size]
        return order

    def _plan(self, epoch: int) -> List[List[int]]:
        order = self._shard(epoch)
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __len__(self) -> int:
        """Batches per epoch on this rank (with a sampler: of len(sampler) indices)."""
        samples = self._length
        if self.sampler is not None:
            if not hasattr(self.sampler, "__len__"):
                raise TypeError(f"Loader over a sampler without len() (a {type(self.sampler).__name__}) has no len()")
            samples = len(self.sampler)
        full, rest = divmod(samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __bool__(self) -> bool:
        return True

    def set_epoch(self, epoch: int) -> None:
        """The number of the next epoch (its shuffle and its samples' seeds), as DistributedSampler's; a
        sampler with a set_epoch (a DistributedSampler) gets it too."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"Loader.set_epoch({epoch!r}): expected an integer >= 0")
        self._next_epoch = epoch
        if self.sampler is not None and callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)

    # ---- workers ----------------------------------------------------------------------------------

    def _start_workers(self, transform: Any, worker_init_fn: Any) -> None:
        if self.workers == 0:
            return
        if self.start_method != "fork" and getattr(multiprocessing.current_process(), "_inheriting", False):
            # multiprocessing's mark of a spawned process importing the main module, where it refuses to
            # start another (the script's body reruns in each worker).
            raise RuntimeError("ferry Loader: made while this process starts as a worker of a spawn or forkserver "
                               "start method and imports the main module again: the main module makes a Loader "
                               "outside `if __name__ == \"__main__\":`; put the script's code under it")
        ctx = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            _preload_forkserver()
        # The parent-death signal follows the thread that forked: only the main thread lives as long as
        # the process. From another thread, or under a forkserver, a worker finds out by EOF instead.
        on_main = threading.current_thread() is threading.main_thread()
        parent = os.getpid() if on_main and self.start_method != "forkserver" else None
        collect = gc.isenabled()
        for wid in range(self.workers):
            task_r, task_w = ctx.Pipe(duplex=False)
            result_r, result_w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_main, name=f"ferry-loader-{wid}", daemon=True,
                            args=(wid, self.workers, self.seed, self.dataset, transform, worker_init_fn, _Fd(self._memfd),
                                  task_r, result_w, parent, collect))
            try:
                with warnings.catch_warnings():
                    # Python 3.12 warns that fork() in a threaded process may deadlock the child; the
                    # worker only runs Python and the dataset (as a DataLoader's forked workers do).
                    warnings.simplefilter("ignore", DeprecationWarning)
                    gc.disable()  # until the worker has frozen what it inherited (_worker_main)
                    try:
                        p.start()
                    finally:
                        if collect:
                            gc.enable()
            except BaseException as e:
                for end in (task_r, task_w, result_r, result_w):
                    end.close()
                if isinstance(e, Exception):
                    raise self._start_failed(wid, e) from e
                raise
            task_r.close()  # the child's ends: EOF on the results pipe then means the worker died
            result_w.close()
            self._workers.append(_Worker(wid, p, task_w, result_r))

    def _start_failed(self, wid: int, e: Exception) -> RuntimeError:
        what = f"ferry Loader: worker {wid} of {self.workers} could not be started ({type(e).__name__}: {e})"
        if self.start_method != "fork" and isinstance(e, (pickle.PicklingError, AttributeError, TypeError)):
            return RuntimeError(f"{what}: under start_method={self.start_method!r} the dataset, transform and "
                                "worker_init_fn are pickled to each worker: define them at the top level of an "
                                "importable module (not inside a function, `python -c` or a notebook), or pass "
                                "start_method='fork' (Linux)")
        if isinstance(e, OSError):
            return RuntimeError(f"{what}: the system refused another process; lower workers= (now "
                                f"{self.workers}), or workers=0 to make the samples in this process")
        return RuntimeError(f"{what}; start_method={self.start_method!r}: another start method may work "
                            "(start_method='fork', 'spawn' or 'forkserver'), or workers=0 to make the samples in "
                            "this process")

    def _worker_died(self, w: _Worker, holding: str) -> RuntimeError:
        w.process.join(0.05)
        code = w.process.exitcode
        hint = ""
        if code is None:
            how = "is still running but closed its pipe"
        elif code < 0:
            how = f"was killed by signal {_signal_name(-code)}"
            if -code == signal.SIGKILL:
                hint = ("; SIGKILL is often the kernel's out-of-memory killer (dmesg says): lower workers= or "
                        "what each worker holds")
            elif -code in _CRASHES:
                hint = "; a crash, in native code the dataset ran: the worker's Python stack is on stderr"
        else:
            how = f"exited with status {code}"
            hint = "; its error, if any, is on stderr (a dataset that calls sys.exit() or os._exit() ends its worker)"
        if not w.started:
            how += " while starting"
            if self.start_method != "fork" and code is not None and code > 0:
                hint = (f"; its error is on stderr. Under start_method={self.start_method!r} a worker imports the "
                        "main module again and unpickles the dataset (a Dataset defined in `python -c` or a "
                        f"notebook cannot be): {_MAIN_GUARD_FIX}")
        held = f" {holding}" if holding else ""
        return RuntimeError(f"ferry Loader worker {w.id} (pid {w.pid}) {how}{held}; the loader is closed{hint}")

    def _not_started(self, workers: Iterable[_Worker]) -> str:
        """What to do about those of `workers` that never started (sent nothing, not even "ready", since
        they were started), said where one holds up the loader at the timeout: under spawn and forkserver
        such a worker is still importing the main module, or blocked in it (a script whose top level runs
        torch.distributed.init_process_group() blocks there, waiting for ranks that never come); "" if
        every one of them started."""
        late = [w for w in workers if not w.started and not w.results.poll()]  # a first message is "ready"
        if not late:
            return ""
        who = (f"worker {late[0].id} never started" if len(late) == 1
               else f"workers {', '.join(str(w.id) for w in late)} never started")
        if self.start_method == "fork":
            return f"; {who} (nothing came from it since the fork)"
        return (f"; {who}: under start_method={self.start_method!r} a worker first imports the main module again "
                "and unpickles the dataset, so a script's top-level code runs in it (there, a "
                "torch.distributed.init_process_group() outside the main guard waits for ranks that never come): "
                f"{_MAIN_GUARD_FIX}; a worker merely slow to import needs a larger timeout=")

    def _send(self, w: _Worker, msg: Any) -> None:
        try:
            w.tasks.send(msg)
        except (BrokenPipeError, OSError) as e:
            # A worker whose worker_init_fn raised left that before exiting: _receive raises it, rather
            # than the exit, when sending to the worker fails first.
            while w.results.poll():
                self._receive(w)
            raise self._fail(self._worker_died(w, f"while it was sent work ({e})")) from None

    def _fail(self, error: BaseException) -> BaseException:
        self._failure = error
        self.close()
        return error

    def _receive(self, w: _Worker) -> Any:
        """The worker's next message; a worker_init_fn's failure is raised here, wherever it is read."""
        try:
            msg = w.results.recv()
        except (EOFError, OSError):
            held = ", ".join(f"batch {k} positions {items[0][0]}-{items[-1][0]}" for k, items in w.outstanding)
            raise self._fail(self._worker_died(w, f"while it held {held}" if held else "")) from None
        if msg[0] == "ready":
            w.started = True
        elif msg[0] == "error" and msg[1] == _INIT:
            raise self._init_failed(w, msg)
        return msg

    # ---- the layout, from the first sample -------------------------------------------------------------

    def _set_up(self, first_index: int, epoch: int) -> None:
        import torch
        seed = sample_seed(self.seed, epoch, first_index)
        if self._workers:
            template, spec = self._probe(first_index, seed, epoch)
        else:
            template, spec = self._probe_here(first_index, seed)
        self._template = template
        self._leaves, self._offsets, self._crossing = [], [], []
        offset = 0
        for path, dtype, shape in spec:
            itemsize = torch.empty((), dtype=dtype).element_size()
            nbytes = itemsize * math.prod(shape)
            leaf = _Leaf(path, dtype, tuple(shape), nbytes)
            offset = (offset + _ALIGN - 1) // _ALIGN * _ALIGN
            self._leaves.append(leaf)
            self._offsets.append(offset)
            _, info, restore = _crossing(path, torch.empty((0,), dtype=dtype))
            self._crossing.append(((info.code, info.bits, info.lanes), restore))
            offset += nbytes * self.batch_size
        self._slot_bytes = max(_PAGE, (offset + _PAGE - 1) // _PAGE * _PAGE)
        size = self._slot_bytes * self.slots
        os.ftruncate(self._memfd, size)
        if self._mm is not None:  # a set-up whose prefetcher failed to open: mapped again at this size
            self._anchor = None
            self._mm.close()
            self._mm = None
        self._mm = _SharedMapping(self._memfd, size)
        self._anchor = (c_char * size).from_address(self._mm.address)
        self._open_pipeline()
        for w in self._workers:
            self._send(w, ("layout", size, self._leaves, self._offsets))
        # The workers hold their own descriptors: this one would only be inherited by processes forked
        # later, keeping the memory alive after close() for as long as they run.
        os.close(self._memfd)
        self._memfd = -1

    def _probe(self, first_index: int, seed: int, epoch: int) -> Tuple[Any, List[Tuple[str, Any, Tuple[int, ...]]]]:
        """The first sample's structure and leaves, from worker 0."""
        w = self._workers[0]
        self._send(w, ("probe", first_index, seed, epoch))
        self._probes += 1
        deadline = time.monotonic() + self.timeout
        msg: Any = None
        while self._probe_replies < self._probes:  # an interrupted set-up's reply comes first: skipped
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(RuntimeError(
                    f"ferry Loader: worker 0 (pid {w.pid}, {_ask_for_stack(w.pid)}) made no sample {first_index} "
                    f"within timeout={self.timeout} s{self._not_started([w])}"))
            if multiprocessing.connection.wait([w.results, w.process.sentinel], min(left, 1.0)):
                msg = self._receive(w)
                if msg[0] == "spec" or (msg[0] == "error" and msg[1] == -1):
                    self._probe_replies += 1
        if msg[0] == "error":
            # The loader stays usable: the next iter() asks for the first sample again.
            raise _reraise(msg, f"in ferry Loader worker 0 (pid {w.pid}) at sample {first_index}, the first, which "
                                "sizes the slots (raised by iter())")
        return msg[1], msg[2]

    def _probe_here(self, first_index: int, seed: int) -> Tuple[Any, List[Tuple[str, Any, Tuple[int, ...]]]]:
        """The first sample's structure and leaves, made in this process (workers=0)."""
        flat: List[Tuple[str, Any]] = []
        try:
            with _random_state_kept():
                template = _leaves_of(_make(self.dataset, self._transform, first_index, seed), "sample", flat)
        except Exception as e:
            # The loader stays usable: the next iter() makes the first sample again.
            _note(e, f"raised by the dataset at sample {first_index}, the first, which sizes the slots, in this "
                     "process (ferry Loader with workers=0; raised by iter())")
            raise
        return template, [(p, t.dtype, tuple(t.shape)) for p, t in flat]

    def _open_pipeline(self) -> None:
        """ferry's prefetcher over the slots (registered as pinned by it) and its slot-writable eventfd."""
        h = PrefetchHandle()
        try:
            check(lib.ferry_prefetch_create_slots(self.device.handle, c_void_p(addressof(self._anchor)),
                                                  self._slot_bytes, self.slots, self.depth, byref(h)))
        finally:
            if h:  # owned at once, even when Ctrl-C lands as the call returns
                self._handle = h
        fd = c_int()
        check(lib.ferry_prefetch_slot_event_fd(h, byref(fd)))
        self._event_fd = fd.value

    def _new_pipeline(self) -> None:
        """A new prefetcher over the same slots (after an abandoned epoch): the old one holds batches the
        consumer may still use and batches never written."""
        self._drain_workers()
        old = self._handle
        if old is not None:
            lib.ferry_prefetch_close(old)
            self._handle = None
            lib.ferry_prefetch_destroy(old)
        self._open_pipeline()
        self._dispatch_next = self._taken = 0
        self._batches.clear()
        self._pending.clear()

    def _drain_workers(self) -> None:
        """Waits for every chunk a worker holds (its bytes go to a slot about to be reused)."""
        for w in self._workers:
            while w.outstanding:
                if not multiprocessing.connection.wait([w.results, w.process.sentinel], self.timeout):
                    raise self._fail(RuntimeError(
                        f"ferry Loader worker {w.id} (pid {w.pid}, {_ask_for_stack(w.pid)}) did not finish its "
                        f"chunk within timeout={self.timeout} s{self._not_started([w])}"))
                self._collect(w, self._receive(w))

    # ---- epochs -----------------------------------------------------------------------------------

    @property
    def _epoch(self) -> Optional[_Epoch]:
        return self._epoch_ref() if self._epoch_ref is not None else None

    def __iter__(self) -> Iterator[Any]:
        """A new epoch (see the class)."""
        self._check_usable("__iter__")
        number = self._next_epoch if self._next_epoch is not None else self._epochs_started
        self._next_epoch = None
        self._epochs_started = number + 1
        old = self._epoch
        if old is not None:
            old.ended = True
        batches = self._plan(number)
        if self._handle is None:
            if not batches:
                self._epoch_ref = None
                return iter(())
            self._set_up(batches[0][0], number)
        elif self._batches or self._taken != self._dispatch_next:
            self._new_pipeline()  # the previous epoch was left part-way
        # A batch never dispatched was never written: the epoch starts at the first of them.
        ep = _Epoch(self, number, batches, self._dispatch_next)
        self._epoch_ref = weakref.ref(ep)
        self._plan_k0, self._plan_epoch, self._plan_batches = ep.k0, number, batches
        self._dispatch_end = ep.k0 + len(batches)
        return ep

    def _check_usable(self, what: str) -> None:
        _runtime.check_owner(self, self._pid)
        if self._failure is not None:
            raise RuntimeError(f"Loader.{what}: the loader failed earlier ({self._failure})")
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
        k = ep.k0 + ep.position
        if slot_still_held(self._handle, k, self.depth):  # before anything changes: a refused next() changes nothing
            raise RuntimeError(
                f"Loader: the next batch goes into the device slot of the batch {self.depth} before it, whose "
                f"tensors are still alive; a batch is valid for {self.depth - 1} further next() calls: .clone() "
                "what you keep (list(loader) keeps every batch) or raise depth")
        batch = self._pump(k)
        if batch.error is not None:
            ep.ended = True
            error, batch.error = batch.error, None
            raise error
        out = self._take(batch)
        ep.position += 1
        del self._batches[k]
        return out

    # ---- dispatch and completion ----------------------------------------------------------------------

    def _writable(self, k: int) -> bool:
        out = c_int()
        check(lib.ferry_prefetch_slot_wait(self._handle, c_uint64(k), c_int64(0), byref(out)))
        return bool(out.value)

    def _dispatch(self) -> None:
        """Grants the batches whose slots are free (in order) and hands out chunks to idle workers."""
        while self._dispatch_next < self._dispatch_end and self._writable(self._dispatch_next):
            k = self._dispatch_next
            i, epoch = k - self._plan_k0, self._plan_epoch
            items = list(enumerate(self._plan_batches[i]))  # (position, index); the worker derives the seed
            b = _Batch(k, epoch, i, items)
            for j in range(0, len(items), self.chunk):
                b.pending.append(items[j:j + self.chunk])
            self._batches[k] = b
            self._pending.append(b)
            self._dispatch_next = k + 1
        while self._pending:
            b = self._pending[0]
            while b.pending:
                w = min(self._workers, key=lambda x: len(x.outstanding))
                if len(w.outstanding) >= _MAX_OUTSTANDING:
                    return
                items = b.pending.popleft()
                w.outstanding.append((b.k, items))
                self._send(w, ("chunk", b.k, (b.k % self.slots) * self._slot_bytes, items, b.epoch))
            self._pending.popleft()

    def _init_failed(self, w: _Worker, msg: Any) -> BaseException:
        return self._fail(_reraise(msg, f"in ferry Loader worker {w.id} (pid {w.pid}), in worker_init_fn({w.id}); "
                                        "the loader is closed"))

    def _collect(self, w: _Worker, msg: Any) -> None:
        if msg[0] in ("ready", "spec") or msg[1] == -1:
            return  # a worker's start, or a first-sample reply left by an interrupted set-up
        k = msg[1]
        for i, (held, _) in enumerate(w.outstanding):
            if held == k:  # a worker answers its chunks in the order it got them: this is the oldest of k
                del w.outstanding[i]
                break
        b = self._batches.get(k)
        if msg[0] == "done":
            _, _, samples, nbytes, seconds, writing, cpu = msg
            w.write_seconds += writing
            w.samples += samples
            w.bytes += nbytes
            w.seconds += seconds
            w.cpu_seconds += cpu
            if b is not None:
                b.left -= samples
                if b.left == 0 and b.error is None and not b.readied:
                    try:
                        check(lib.ferry_prefetch_slot_ready(self._handle, c_uint64(k)))
                    finally:
                        b.readied = True  # also when Ctrl-C lands as the call returns: it was marked
        elif msg[0] == "error" and b is not None and b.error is None:
            b.error = _reraise(msg, f"in ferry Loader worker {w.id} (pid {w.pid}) at sample {msg[3]} "
                                    f"(batch {b.number} of epoch {b.epoch}, position {msg[2]})")

    def _pump(self, k: int) -> _Batch:
        """Dispatches and collects until batch k is complete (or failed); returns it."""
        if not self._workers:
            return self._make_here(k)
        deadline = time.monotonic() + self.timeout
        while True:
            self._dispatch()
            b = self._batches.get(k)
            if b is not None and (b.readied or b.error is not None):
                break
            waits: List[Any] = [w.results for w in self._workers] + [w.process.sentinel for w in self._workers]
            if self._event_fd >= 0:
                waits.append(self._event_fd)
            left = deadline - time.monotonic()
            if left <= 0:
                what = f"{b.left} samples left" if b is not None else "its slot never came free"
                holders = [w for w in self._workers if any(held == k for held, _ in w.outstanding)]
                raise self._fail(RuntimeError(
                    f"ferry Loader: batch {k - self._plan_k0} of epoch {self._plan_epoch} was not made within "
                    f"timeout={self.timeout} s ({what}{self._show_holders(k)}){self._not_started(holders)}"))
            self._absorb(multiprocessing.connection.wait(waits, min(left, 1.0)))
        # Whatever else finished meanwhile goes to the copier now, not at the next call.
        self._absorb(multiprocessing.connection.wait([w.results for w in self._workers], 0))
        self._dispatch()
        return b

    def _make_here(self, k: int) -> _Batch:
        """Batch k made in this process (workers=0) into its slot, as a worker would: the same seeds, the
        same bytes; a dataset's exception is kept in the batch, as it is, with a note naming the sample."""
        i, epoch = k - self._plan_k0, self._plan_epoch
        b = _Batch(k, epoch, i, list(enumerate(self._plan_batches[i])))
        self._batches[k] = b
        self._dispatch_next = k + 1
        writable = c_int()
        check(lib.ferry_prefetch_slot_wait(self._handle, c_uint64(k), c_int64(math.ceil(self.timeout * 1000)),
                                           byref(writable)))
        if not writable.value:
            raise self._fail(RuntimeError(f"ferry Loader: batch {i} of epoch {epoch}: its slot did not come free "
                                          f"within timeout={self.timeout} s"))
        slot = self._mm.address + (k % self.slots) * self._slot_bytes
        position = index = -1
        try:
            with _random_state_kept():
                for position, index in b.items:
                    sample = _make(self.dataset, self._transform, index, sample_seed(self.seed, epoch, index))
                    _write_sample(sample, index, position, slot, self._leaves, self._offsets)
        except Exception as e:
            _note(e, f"raised at sample {index} (batch {i} of epoch {epoch}, position {position}) in this process "
                     "(ferry Loader with workers=0)")
            b.error = e
            return b
        try:
            check(lib.ferry_prefetch_slot_ready(self._handle, c_uint64(k)))
        finally:
            b.readied = True
        return b

    def _show_holders(self, k: int) -> str:
        """'; worker 1 (pid 12, state S, its Python stack on stderr) holds positions 6-7' for each worker that
        holds part of batch k, after asking it for its stack (SIGUSR1)."""
        out = []
        for w in self._workers:
            held = [items for held_k, items in w.outstanding if held_k == k]
            if held:
                positions = ", ".join(f"{items[0][0]}-{items[-1][0]}" for items in held)
                out.append(f"worker {w.id} (pid {w.pid}, {_ask_for_stack(w.pid)}) holds positions {positions}")
        b = self._batches.get(k)
        if b is not None and b.pending:
            out.append(f"{sum(map(len, b.pending))} samples not yet handed to a worker")
        return "; " + "; ".join(out) if out else ""

    def _absorb(self, ready: List[Any]) -> None:
        if self._event_fd >= 0 and self._event_fd in ready:
            try:
                os.read(self._event_fd, 8)
            except BlockingIOError:
                pass
        for w in self._workers:
            while w.results in ready and w.results.poll():
                self._collect(w, self._receive(w))
            if w.process.sentinel in ready and not w.results.poll():
                raise self._fail(self._worker_died(w, "while the loader ran"))

    # ---- the batch on the device ---------------------------------------------------------------------

    def _take(self, b: _Batch) -> Any:
        """Batch b on the device: taken from ferry's prefetcher (which hands batches out in order)."""
        consumer = stream_handle(self.device, None)
        handle = BatchHandle()
        n = len(b.items)
        try:
            check(lib.ferry_prefetch_next(self._handle, consumer, byref(handle)))
            self._taken += 1
            values = [batch_tensor(handle, base, (n, *leaf.shape) if restore is None else (n * leaf.nbytes,), dtype,
                                   None if restore is None else (restore[0], (n, *leaf.shape)))
                      for leaf, base, (dtype, restore) in zip(self._leaves, self._offsets, self._crossing)]
        finally:
            lib.ferry_batch_release(handle)
        if self.device.backend == "host":
            check(lib.ferry_stream_synchronize(self.device.handle, consumer))
        return _fill(self._template, values)

    # ---- the rest ------------------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The workers' counters (samples, bytes written into slots, seconds and CPU seconds in the
        dataset and the write, write_seconds: the part of seconds spent writing into the slots) and the
        prefetcher's (batches, bytes copied, h2d_gbps, stages; copies are counted once complete, all of
        them after close(); since the last new pipeline, which an epoch left part-way starts)."""
        out: Dict[str, Any] = {
            "slots": self.slots, "slot_bytes": self._slot_bytes, "workers": [
                {"id": w.id, "pid": w.pid, "samples": w.samples, "bytes": w.bytes, "seconds": w.seconds,
                 "cpu_seconds": w.cpu_seconds, "write_seconds": w.write_seconds} for w in self._workers]}
        if self._handle is not None:
            out["prefetch"] = self._prefetch_stats(self._handle)
        elif self._final_prefetch is not None:
            out["prefetch"] = self._final_prefetch
        return out

    @staticmethod
    def _prefetch_stats(h: PrefetchHandle) -> Dict[str, Any]:
        import json
        from .._c import take_string
        raw = c_void_p()
        check(lib.ferry_prefetch_stats_json(h, byref(raw)))
        return json.loads(take_string(raw))

    def close(self) -> None:
        """Stops the workers (SIGKILL for any that has not exited within a second), the prefetcher, and
        frees the shared memory. Batches already yielded stay valid while their tensors live. Idempotent."""
        if getattr(self, "_closed", True) or self._pid != _runtime.current_pid():
            return
        self._closed = True
        try:
            self._stop_workers()
        finally:  # Ctrl-C during the joins still frees the memory, registration first
            self._free_memory()

    def _stop_workers(self) -> None:
        for w in self._workers:
            try:
                w.tasks.send(None)
            except (OSError, ValueError):
                pass
            w.tasks.close()
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self._workers:
            if w.process.is_alive():
                w.process.kill()
                w.process.join(1.0)
            w.results.close()
            try:
                w.process.close()  # its sentinel descriptor
            except ValueError:
                pass  # still running after SIGKILL and a second: the kernel reaps it; its pid stays in stats()

    def _free_memory(self) -> None:
        h = self._handle
        try:
            if h is not None:
                lib.ferry_prefetch_close(h)  # unregisters the slots: before they are unmapped
                self._final_prefetch = self._prefetch_stats(h)  # every copy counted, now that all are done
        finally:
            if h is not None:
                self._handle = None
                lib.ferry_prefetch_destroy(h)
            self._event_fd = -1
            self._anchor = None
            if self._mm is not None:
                self._mm.close()  # after the anchor: nothing refers to the memory any more
                self._mm = None
            if self._memfd >= 0:
                os.close(self._memfd)
                self._memfd = -1
            self._batches.clear()
            self._pending.clear()
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


class _SharedMapping:
    """The main process's mapping of the slots: populated, and not inherited by processes forked later
    (MADV_DONTFORK: another loader's workers, a DataLoader's). mmap.mmap would keep a duplicate of the
    descriptor open, which those processes would inherit, keeping the memory alive after close() for as
    long as they run; this mapping keeps none."""

    def __init__(self, fd: int, size: int) -> None:
        import ctypes
        self.address = 0
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = c_void_p
        libc.mmap.argtypes = [c_void_p, ctypes.c_size_t, c_int, c_int, c_int, ctypes.c_long]
        libc.munmap.argtypes = [c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [c_void_p, ctypes.c_size_t, c_int]
        self._libc, self.size, self._pid = libc, size, _runtime.current_pid()
        addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), fd, 0)
        if addr is None or addr == c_void_p(-1).value:
            err = ctypes.get_errno()
            raise OSError(err, f"ferry Loader: mapping {size} bytes of shared slots failed: {os.strerror(err)}")
        self.address = addr
        if hasattr(mmap, "MADV_DONTFORK") and libc.madvise(addr, size, mmap.MADV_DONTFORK) != 0:
            err = ctypes.get_errno()
            self.close()
            raise OSError(err, f"ferry Loader: madvise(MADV_DONTFORK) on the slots failed: {os.strerror(err)}")

    def close(self) -> None:
        # In a fork child (a copy of this object, collected there) the mapping is not inherited
        # (MADV_DONTFORK): the address range may hold something else of the child's.
        if self.address and self._pid == _runtime.current_pid():
            self._libc.munmap(self.address, self.size)
        self.address = 0

    def __del__(self) -> None:
        self.close()


def _ask_for_stack(pid: int) -> str:
    """Asks a worker for its Python stack (SIGUSR1: faulthandler prints it to the worker's stderr) and
    says its scheduler state from /proc ("R" running, "S" sleeping, "D" in the kernel...) and where the
    stack is: "state S, its Python stack on stderr"; "gone" for a worker that exited. Only a worker that
    catches SIGUSR1 is asked: one still starting (before faulthandler is registered) would be killed by it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        state = fields["State"].split()[0]
        if not int(fields["SigCgt"], 16) >> (signal.SIGUSR1 - 1) & 1:
            return f"state {state}, still starting: no stack"
        os.kill(pid, signal.SIGUSR1)
        return f"state {state}, its Python stack on stderr"
    except (OSError, KeyError, IndexError, ValueError):
        return "gone"


_warned_start_method = False
_MAIN_GUARD_FIX = ("guard the script with `if __name__ == \"__main__\":`, define the dataset, transform and "
                   "worker_init_fn in an importable module, or pass start_method='fork' (Linux)")
_CRASHES = frozenset(int(getattr(signal, n)) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
                     if hasattr(signal, n))


def _checked_start_method(asked: Optional[str]) -> None:
    """Refuses (ValueError) a start method that this platform does not have."""
    methods = multiprocessing.get_all_start_methods()
    if asked is not None and asked not in methods:
        raise ValueError(f"Loader(start_method={asked!r}): this platform has {', '.join(methods)}")


def _program_start_method() -> Optional[str]:
    """The start method the program chose with multiprocessing.set_start_method(), which a DataLoader
    without multiprocessing_context follows; None where it chose none, or Python's own default: that is
    also what multiprocessing fixes at the first use of its default context (every spawn or forkserver
    start asks for it), so it says nothing of the program's wish."""
    chosen = multiprocessing.get_start_method(allow_none=True)
    default = getattr(getattr(multiprocessing.context, "_default_context", None), "_default_context", None)
    return None if chosen is None or (default is not None and chosen == default.get_start_method()) else chosen


def _start_method(asked: Optional[str]) -> str:
    """The start method of a Loader's workers: `asked`; else the one the program chose with
    multiprocessing.set_start_method(), as DataLoader; else fork, as DataLoader on Linux (also while
    other Python threads run: a worker runs only the dataset's Python code, never CUDA, and
    multiprocessing and logging renew their locks in a fork child), where fork is safe; elsewhere spawn,
    said once (a warning naming why, and start_method=)."""
    if asked is not None:
        _checked_start_method(asked)
        return asked
    program = _program_start_method()
    if program is not None:
        return program
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and sys.platform != "darwin":
        return "fork"
    why = ("macOS's system libraries are not safe in a fork child; Python's default there is spawn"
           if "fork" in methods else "this platform cannot fork")
    global _warned_start_method
    if not _warned_start_method:
        _warned_start_method = True
        warnings.warn(f"ferry Loader: workers start with 'spawn', not 'fork' ({why}): each worker imports the main "
                      "module again and gets the dataset, transform and worker_init_fn pickled, so define them in an "
                      "importable module and guard the script with `if __name__ == \"__main__\":`; pass "
                      "start_method= to choose (and silence this)", RuntimeWarning, stacklevel=3)
    return "spawn"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return str(number)


def _is_iterable_dataset(dataset: Any) -> bool:
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return False
    return isinstance(dataset, IterableDataset)


def _sampled_index(i: Any, position: int, n: int) -> int:
    """The dataset index a sampler gave at `position`, checked: an integer in [-n, n), the indices a
    sequence of n items takes. A negative one reaches dataset[i] as it is, as a DataLoader passes it
    (the dataset's __getitem__ gives it its meaning; a TensorDataset's, a list's: counted from the end)."""
    try:
        index = operator.index(i)
    except TypeError:
        raise TypeError(f"Loader: the sampler gave {i!r} (a {type(i).__name__}) at position {position}; a Loader's "
                        f"sampler yields dataset indices, integers in [{-n}, {n})") from None
    if not -n <= index < n:
        raise ValueError(f"Loader: the sampler gave index {index} at position {position}; the dataset has {n} "
                         f"samples (indices 0 to {n - 1}, or -{n} to -1 from the end)")
    return index


def _preload_forkserver() -> None:
    """A forkserver that the Loader starts imports torch and the workers' module once, so that each worker
    is forked with them in place: without, every worker imports torch again (3.5-5 s each with torch 2.11
    and CUDA's libraries, docs/PERFORMANCE.md). A forkserver already running is left as it is."""
    from multiprocessing import forkserver
    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is not None:
        return
    modules = list(getattr(server, "_preload_modules", ["__main__"]))
    forkserver.set_forkserver_preload(modules + [m for m in ("torch", __name__) if m not in modules])


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


class _Verbatim(str):
    def __repr__(self) -> str:
        return str(self)


def _reraise(msg: Tuple[Any, ...], where: str) -> BaseException:
    """The worker's exception, rebuilt in this process: its own type when that can be made from one
    message, else RuntimeError, with the worker's traceback in the message."""
    _, _, _, _, module, name, text, tb = msg
    full = f"{text}\n{where}; the worker's traceback:\n{tb}"
    cls: Any = None
    try:
        mod = sys.modules.get(module) or __import__(module)
        cls = mod
        for part in name.split("."):
            cls = getattr(cls, part)
    except Exception:  # noqa: BLE001
        cls = None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, StopIteration):
        # (a StopIteration raised from next() would end the epoch silently)
        try:
            # KeyError's str() is the repr of its argument: keep the lines readable.
            return cls(_Verbatim(full) if issubclass(cls, KeyError) else full)
        except Exception:  # noqa: BLE001 - not constructible from one string
            pass
    return RuntimeError(f"{name}: {full}")
