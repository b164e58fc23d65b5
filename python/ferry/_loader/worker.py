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
from .layout import Layout, Spec
from .order import sample_seed, worker_seed
from .protocol import INIT, PROBE, error_message


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

    def write(self, sample: Any, index: int, position: int, slot: int, layout: Layout) -> int:
        """Writes the sample at `position` of the batch whose slot is at address `slot`; its bytes.
        Raises ValueError naming the index and the field for a sample that does not fit the layout."""
        raise NotImplementedError


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


def make(fmt: SampleFormat, dataset: Any, transform: Optional[Callable[[Any], Any]], index: int, seed: int) -> Any:
    """Sample `index`, made with every generator seeded by `seed`."""
    if _worker is not None:
        _worker["seed"] = seed
    fmt.seed(seed)
    sample = dataset[index]
    return transform(sample) if transform is not None else sample


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
    layout: Optional[Layout] = None
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
                assert mapping is not None and layout is not None  # the layout comes first on the pipe
                _, chunk, slot_offset, items, epoch = msg
                results.send(_write_chunk(fmt, dataset, transform, seed_root, chunk, mapping.address + slot_offset,
                                          items, epoch, layout))
            elif kind == "probe":
                _, index, seed, epoch = msg
                try:
                    template, spec = fmt.spec(make(fmt, dataset, transform, index, seed))
                    results.send(("spec", template, spec))
                except Exception as e:  # noqa: BLE001 - the main process raises it
                    results.send(error_message(PROBE, 0, index, e))
            elif kind == "layout":
                _, size, layout = msg
                if mapping is not None:
                    mapping.close()
                mapping = WorkerMapping(memfd.fd, size)
            elif kind == "sync":
                results.send(("synced", msg[1]))
    finally:
        if mapping is not None:
            mapping.close()


def _write_chunk(fmt: SampleFormat, dataset: Any, transform: Any, seed_root: int, chunk: int, slot: int,
                 items: List[Tuple[int, int]], epoch: int, layout: Layout) -> Tuple[Any, ...]:
    """The one reply to a chunk: "done" with the counters, or "error" at the first sample that failed."""
    t0, c0 = time.perf_counter(), time.process_time()
    written, writing = 0, 0.0
    for position, index in items:
        try:
            sample = make(fmt, dataset, transform, index, sample_seed(seed_root, epoch, index))
            w0 = time.perf_counter()
            written += fmt.write(sample, index, position, slot, layout)
            writing += time.perf_counter() - w0
        except Exception as e:  # noqa: BLE001 - raised in the main process at this batch
            return error_message(chunk, position, index, e)
    return ("done", chunk, len(items), written, time.perf_counter() - t0, writing, time.process_time() - c0)
