"""A Loader's worker process: its loop over the messages of ferry/_loader/protocol.py, what it tells the
dataset (worker_info()), how it is seeded, and what it does about what it inherited (framework-neutral:
the adapter's SampleFormat makes, flattens and writes the samples).

What a forked worker inherited is the parent's: a garbage collection there must not run the parent's
finalizers (a parent's ferry or CUDA object freed in a fork child can wait forever on a lock that one of
the parent's threads held at the fork). The parent forks with the collector off (so none runs in the
child before the worker's first line); the worker freezes everything it inherited (never collected, nor
written by the collector: its pages stay shared with the parent), then turns the collector on again if
the parent had it on.
"""
from __future__ import annotations

import gc
import os
import signal
import time
from typing import Any, Callable, ContextManager, Dict, List, NamedTuple, Optional, Tuple

from .._native.loader import WorkerMapping, die_with_parent
from .layout import CapacityError, Layout, Spec
from .order import epoch_seed, index_seed, worker_seed
from .protocol import INIT, PROBE, error_message, grow_message


class SampleFormat:
    """What a framework adapter gives the core: how a worker is set up and seeded, and how a sample
    becomes a template with leaves and bytes in a slot (ferry.torch's: ferry/torch/_samples.py). An
    instance is pickled to spawned workers: a module-level class."""

    def set_up_worker(self, wid: int, workers: int, seed: int, dataset: Any) -> None:
        """In a worker, before worker_init_fn: the framework's per-worker state."""

    def seed(self, seed: int) -> None:
        """Seeds every generator a dataset may draw from."""
        raise NotImplementedError

    def random_state_kept(self) -> ContextManager[None]:
        """The generators' states, as they were, after the block (workers=0 seeds them in the caller)."""
        raise NotImplementedError

    def spec(self, sample: Any) -> Tuple[Any, List[Spec]]:
        """The sample's template (ferry._template) and its leaves."""
        raise NotImplementedError

    def writer(self, layout: Layout, address: int, buffer: Any) -> "Writer":
        """What writes chunks into the slots of a mapping at `address` (`buffer`: a writable buffer over
        it) laid out by `layout`."""
        raise NotImplementedError

    def seed_lazily(self, seed: int) -> None:
        """Seeds the generators before a worker's sample; an adapter may leave one unseeded that the
        samples do not draw from (drawn_unseeded() then says whether one did)."""
        self.seed(seed)

    def drawn_unseeded(self) -> bool:
        """After a sample seeded by seed_lazily(): whether it drew from a generator left unseeded (the
        worker then makes it again after seed())."""
        return False

    # A last step of every sample after the dataset and the transform, given the sample's seed (None: no
    # step): ferry.torch's ImageDecode replaces the encoded image by what the write puts in the slot.
    prepare: Optional[Callable[[Any, int], Any]] = None

    def sample_hooks(self) -> Tuple[Callable[[int], None], Callable[[], bool]]:
        """(seed_lazily, drawn_unseeded), or cheaper equivalents valid until drawn_unseeded() returns True
        (then fetched again)."""
        return self.seed_lazily, self.drawn_unseeded


class AtSample(Exception):
    """A sample's write that failed after later samples were taken (a Writer writes some at the end of a
    chunk): the position and index of the sample and its error."""

    def __init__(self, position: int, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.position, self.index, self.error = position, index, error


class Writer:
    """Writes the samples of one chunk at a time into a slot: begin(), add() for each sample in order of
    position, finish(). add() raises the sample's refusal (ValueError naming the index and the field); a
    writer may keep samples and write them later (flush() and finish() raise AtSample for one that then
    fails, after writing those before it). `seconds` counts the time spent writing, `written` the
    samples' bytes written since begin()."""
    seconds = 0.0
    written = 0

    def begin(self, slot_offset: int, first: int, count: int) -> None:
        raise NotImplementedError

    def add(self, sample: Any, index: int, position: int) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Writes the samples kept so far."""

    def finish(self) -> int:
        """Writes what is left; the bytes written since begin()."""
        raise NotImplementedError

    def close(self) -> None:
        """Drops every reference to the mapping (before it is unmapped)."""


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


def make(fmt: SampleFormat, dataset: Any, transform: Optional[Callable[[Any], Any]], index: int, seed: int,
         lazy: bool = False) -> Any:
    """Sample `index`, made with every generator seeded by `seed` (lazy: as fmt.seed_lazily() seeds them,
    made again, every generator seeded, when it drew from one left unseeded)."""
    if _worker is not None:
        _worker["seed"] = seed
    if lazy:
        fmt.seed_lazily(seed)
        sample = dataset[index]
        sample = transform(sample) if transform is not None else sample
        if not fmt.drawn_unseeded():
            return sample if fmt.prepare is None else fmt.prepare(sample, seed)
    fmt.seed(seed)
    sample = dataset[index]
    sample = transform(sample) if transform is not None else sample
    return sample if fmt.prepare is None else fmt.prepare(sample, seed)


class Fd:
    """A file descriptor for a worker: inherited as it is under fork, duplicated into the child under
    spawn and forkserver (multiprocessing's DupFd, as its Connection objects cross)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        from multiprocessing import reduction
        return _rebuild_fd, (reduction.DupFd(self.fd),)


def _rebuild_fd(dup: Any) -> "Fd":
    return Fd(dup.detach())


def _die_with_parent(parent: Optional[int]) -> None:
    """SIGKILL this worker when the process that started it dies (Linux), and exit now if it already has
    (`parent` None: a forkserver's child, or started from a thread other than the main one, whose exit
    would fire the signal: the worker then ends at EOF on its task pipe)."""
    if parent is None:
        return
    die_with_parent()
    if os.getppid() != parent:
        os._exit(0)


def worker_main(wid: int, workers: int, seed_root: int, dataset: Any, transform: Optional[Callable[[Any], Any]],
                worker_init_fn: Optional[Callable[[int], None]], fmt: SampleFormat, memfd: Fd, tasks: Any,
                results: Any, parent: Optional[int], collect: bool) -> None:
    global _worker
    gc.disable()  # see the module
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
    own_seed = worker_seed(seed_root, wid)
    _worker = {"id": wid, "workers": workers, "seed": own_seed, "dataset": dataset}
    fmt.set_up_worker(wid, workers, own_seed, dataset)
    fmt.seed(own_seed)  # as a DataLoader's worker is seeded before its worker_init_fn
    mapping: Optional[WorkerMapping] = None
    writer: Optional[Writer] = None
    try:
        if worker_init_fn is not None:
            try:
                worker_init_fn(wid)
            except Exception as e:  # noqa: BLE001 - the main process raises it, then the worker exits
                results.send(error_message(INIT, 0, -1, e))
                return
        while True:
            try:
                msg = tasks.recv()
            except (EOFError, OSError):
                return  # the main process closed the pipe or died
            if msg is None:
                return
            kind = msg[0]
            if kind == "chunk":
                assert writer is not None  # the layout comes first on the pipe
                _, chunk, slot_offset, items, epoch = msg
                results.send(_write_chunk(fmt, dataset, transform, seed_root, chunk, slot_offset, items, epoch,
                                          writer))
            elif kind == "probe":
                _, index, seed, epoch = msg
                try:
                    template, spec = fmt.spec(make(fmt, dataset, transform, index, seed))
                    results.send(("spec", template, spec))
                except Exception as e:  # noqa: BLE001 - the main process raises it
                    results.send(error_message(PROBE, 0, index, e))
            elif kind == "layout":
                _, size, layout = msg
                if writer is not None:
                    writer.close()
                    writer = None
                if mapping is not None:
                    mapping.close()
                mapping = WorkerMapping(memfd.fd, size)
                writer = fmt.writer(layout, mapping.address, mapping.buffer())
            elif kind == "sync":
                results.send(("synced", msg[1]))
    finally:
        if writer is not None:
            writer.close()
        if mapping is not None:
            mapping.close()


def _write_chunk(fmt: SampleFormat, dataset: Any, transform: Any, seed_root: int, chunk: int, slot_offset: int,
                 items: List[Tuple[int, int]], epoch: int, writer: Writer) -> Tuple[Any, ...]:
    """The one reply to a chunk: "done" with the counters, or "error" at the first sample that failed (a
    write the writer kept for the chunk's end comes before a later sample's error)."""
    t0, c0 = time.perf_counter(), time.process_time()
    w0 = writer.seconds
    writer.begin(slot_offset, items[0][0], len(items))
    base = epoch_seed(seed_root, epoch)
    info = _worker
    seed_lazily, drawn_unseeded = fmt.sample_hooks()
    prepare = fmt.prepare
    try:
        for position, index in items:
            try:
                # make(..., lazy=True), inlined: this loop is the per-sample cost of cheap samples
                seed = index_seed(base, index)
                if info is not None:
                    info["seed"] = seed
                seed_lazily(seed)
                sample = dataset[index]
                if transform is not None:
                    sample = transform(sample)
                if drawn_unseeded():
                    sample = make(fmt, dataset, transform, index, seed)
                    seed_lazily, drawn_unseeded = fmt.sample_hooks()
                elif prepare is not None:
                    sample = prepare(sample, seed)
            except Exception as e:  # noqa: BLE001 - raised in the main process at this batch
                writer.flush()  # a refusal of a sample before this one comes first
                return error_message(chunk, position, index, e)
            try:
                writer.add(sample, index, position)
            except AtSample:
                raise
            except CapacityError as e:
                return grow_message(chunk, position, index, e)
            except Exception as e:  # noqa: BLE001
                return error_message(chunk, position, index, e)
        written = writer.finish()
    except AtSample as e:
        return error_message(chunk, e.position, e.index, e.error)
    return ("done", chunk, len(items), written, time.perf_counter() - t0, writer.seconds - w0,
            time.process_time() - c0)
