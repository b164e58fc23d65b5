"""The main process of a Loader, framework-neutral: the shared slots, the workers, the first sample that
sizes the slots, and the chunks of each batch handed out and counted until ferry's prefetcher may copy it.

Memory. One memfd (an anonymous shared-memory file: no name under /dev/shm, nothing to leak, not bound by
/dev/shm's size) holds `slots` batch slots. The main process maps it and registers the mapping with the
driver once (the SlotPrefetcher: cudaHostRegister, verified; the host backend locks it); the workers map
the same file and write into the same physical pages, so the copy engine reads what they wrote. Workers
never touch CUDA. Where a batch's bytes lie in its slot: ferry/_loader/layout.py.

Work. Batch k (counted across epochs) lives in the slot SlotPrefetcher.slot_offset(k) names. The main
process hands a batch's samples to the workers in chunks once ferry says its slot is writable (the batch
`slots` before it reached the device), at most two chunks per worker at a time, so every worker helps
with the oldest batch; a worker writes a chunk and answers with one short message (the messages, and why
none is lost: ferry/_loader/protocol.py). All of it runs in next() on the caller's thread: the main
process never touches a batch's bytes. With workers=0 the main process makes each batch's samples in
next() and writes them into the same slots itself, with the same seeds.

Note [Holding a slot]
An adapter that reads a batch's host bytes after ferry's prefetcher copied them (a GPU decode that hands
the encoded bytes in the slot to nvJPEG, which reads them until an event) must keep the workers from
writing the next batch into that slot meanwhile. Engine.hold(k, wait) registers a callable for batch k;
the engine calls it on the thread that runs next(), just before it grants batch k + slots (the next batch
of that slot) to the workers, or before a new pipeline starts again from slot 0 (an epoch left part-way)
or close() frees the memory; wait() blocks until the reader is done (a CUDA event's synchronize) and may
raise, which next() then raises. Once batch k + slots was granted, hold(k) raises. So that a hold
registered when batch k is taken is always in time, hold_until_taken (set before the first epoch) grants
batch j only after batch j - slots was taken (without it, the engine may grant the slot as soon as the
copy is done, one next() ahead). slot_address(k) is batch k's slot in this process's mapping; its leaves
lie at layout.offsets (and a ragged leaf's offsets and lengths at layout.starts and layout.lengths) from
it. Tested on the host backend: tests/python/test_loader_protocol.py,
test_a_held_slot_is_not_handed_out_again_until_its_wait_returns.
"""
from __future__ import annotations

import collections
import math
import multiprocessing.connection
import os
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from .._native.loader import SharedMapping, SlotPrefetcher, read_int64s
from . import processes
from .layout import PADDED, CapacityError, Layout, Spec
from .order import sample_seed
from .processes import Worker, ask_for_stack
from .protocol import INIT, MAX_OUTSTANDING, PROBE, rebuild_error
from .worker import AtSample, SampleFormat, Writer, make

SMALL_SAMPLE = 4096  # a sample of at most this many bytes gets Engine.small_chunk samples a chunk
_UNSENT = -1  # a part of a batch not handed out (or handed out and lost: handed out again)
_ANSWERED = -2  # a part whose samples are written


def note(e: BaseException, text: str) -> None:
    """Adds `text` to an exception raised as it is (Python >= 3.11 shows notes under the message)."""
    if hasattr(e, "add_note"):
        e.add_note(text)


class Batch:
    """Batch k of the current pipeline: its samples [(position, index)] cut into parts (one chunk each),
    each part _UNSENT, held as the id of the chunk that carries it, or _ANSWERED."""
    __slots__ = ("k", "epoch", "number", "items", "parts", "state", "pending", "error", "readied", "longest",
                 "grow")

    def __init__(self, k: int, epoch: int, number: int, items: List[Tuple[int, int]], chunk: int) -> None:
        self.k, self.epoch, self.number, self.items = k, epoch, number, items
        self.parts = [items[j:j + chunk] for j in range(0, len(items), chunk)]
        self.state = [_UNSENT] * len(self.parts)
        self.pending: Deque[int] = collections.deque(range(len(self.parts)))  # parts to hand out, in order
        self.error: Optional[BaseException] = None
        self.readied = False
        self.longest: Dict[int, int] = {}  # a padded leaf's longest sample (rows), read as the batch is readied
        # A sample past a variable leaf's capacity: (path, argument, capacity, message, position) of the first
        self.grow: Optional[Tuple[str, str, int, str, int]] = None

    def written(self) -> bool:
        return all(s == _ANSWERED for s in self.state)

    def left(self) -> int:
        return sum(len(p) for p, s in zip(self.parts, self.state) if s != _ANSWERED)


class Chunk:
    """A part of a batch sent to a worker under an id used once."""
    __slots__ = ("id", "batch", "part")

    def __init__(self, cid: int, batch: Batch, part: int) -> None:
        self.id, self.batch, self.part = cid, batch, part

    @property
    def items(self) -> List[Tuple[int, int]]:
        return self.batch.parts[self.part]


class Engine:
    """The main process's side of a Loader (see the module). `on_fail(error)` is called with an error
    that ends the loader (a dead worker, a timeout) before it is raised; the owner closes then."""

    def __init__(self, *, dataset: Any, transform: Optional[Callable[[Any], Any]], fmt: SampleFormat,
                 batch_size: int, seed: int, depth: int, slots: int, chunk: int, timeout: float,
                 start_method: Optional[str], on_fail: Callable[[BaseException], None],
                 capacity: Optional[Dict[str, int]] = None, small_chunk: Optional[int] = None) -> None:
        self.dataset, self.transform, self.fmt = dataset, transform, fmt
        self.batch_size, self.seed, self.depth, self.slots, self.chunk = batch_size, seed, depth, slots, chunk
        self.capacity = dict(capacity or {})
        # The chunk for samples of at most SMALL_SAMPLE bytes, when the caller gave none (None: `chunk`).
        self.small_chunk = small_chunk
        self._writer: Optional[Writer] = None  # workers=0: the main process's writer
        # Note [Holding a slot]: batch k's slot is not granted to batch k + slots before holds[k]() returns.
        self.holds: Dict[int, Callable[[], None]] = {}
        self.hold_until_taken = False
        self.timeout, self.start_method, self._on_fail = timeout, start_method, on_fail
        self.failure: Optional[BaseException] = None
        self.workers: List[Worker] = []
        self.active = 0  # the first `active` workers get chunks (all of them: set by start_workers)
        self.prefetcher: Optional[SlotPrefetcher] = None
        self.mapping: Optional[SharedMapping] = None
        self.layout: Optional[Layout] = None
        self.template: Any = None
        self.final_stats: Optional[Dict[str, Any]] = None
        self._device: Any = None  # the native device (ferry._native.device.Device) the prefetcher is made on
        # Batches are numbered across epochs as ferry's slot feed counts them.
        self.batches: Dict[int, Batch] = {}  # dispatched and not yet taken
        self._pending: Deque[Batch] = collections.deque()  # dispatched with parts not yet sent, in order
        self._probes = self._probe_replies = 0  # first-sample requests sent to worker 0, replies read
        self.dispatch_next = 0  # the next batch to dispatch
        self.taken = 0  # batches taken from ferry's prefetcher (in order)
        self._dispatch_end = 0  # the end of the current epoch's batches
        self._plan_k0, self._plan_epoch = 0, 0
        self._plan_batches: List[List[int]] = []  # the current epoch's dataset indices, per batch
        self._chunk_ids = 0
        self._sync_token = 0
        self._unsure = False  # an exception left it unknown whether a message or its reply crossed
        self.dropped_replies = 0  # replies of chunks no longer recorded (sent twice, or read again): ignored
        self._memfd = os.memfd_create("ferry-loader", os.MFD_CLOEXEC)

    def start_workers(self, count: int, worker_init_fn: Any, preload: Sequence[str]) -> None:
        """Starts `count` worker processes (none: the samples are made in next()); `preload`: the modules a
        forkserver the Loader starts imports once."""
        if count:
            assert self.start_method is not None
            processes.start_workers(count, self.start_method, self.seed, self.dataset, self.transform, worker_init_fn,
                                    self.fmt, self._memfd, preload, self.workers)
        self.active = len(self.workers)

    # ---- failure ---------------------------------------------------------------------------------------

    def fail(self, error: BaseException) -> BaseException:
        self.failure = error
        self._on_fail(error)
        return error

    def _died(self, w: Worker, holding: str) -> BaseException:
        return self.fail(processes.worker_died(w, holding, self.start_method))

    def _send(self, w: Worker, msg: Any) -> None:
        try:
            w.tasks.send(msg)
        except (BrokenPipeError, OSError) as e:
            # A worker whose worker_init_fn raised left that before exiting: _receive raises it, rather
            # than the exit, when sending to the worker fails first.
            while w.results.poll():
                self._receive(w)
            raise self._died(w, f"while it was sent work ({e})") from None

    def _receive(self, w: Worker) -> Any:
        """The worker's next message; a worker_init_fn's failure is raised here, wherever it is read."""
        try:
            msg = w.results.recv()
        except (EOFError, OSError):
            held = ", ".join(f"batch {c.batch.k} positions {c.items[0][0]}-{c.items[-1][0]}"
                             for c in w.chunks.values())
            raise self._died(w, f"while it held {held}" if held else "") from None
        if msg[0] == "ready":
            w.started = True
        elif msg[0] == "error" and msg[1] == INIT:
            raise self.fail(rebuild_error(msg, f"in ferry Loader worker {w.id} (pid {w.pid}), in "
                                               f"worker_init_fn({w.id}); the loader is closed"))
        return msg

    # ---- the layout, from the first sample -------------------------------------------------------------

    @property
    def set_up_done(self) -> bool:
        return self.prefetcher is not None

    def set_up(self, device: Any, first_index: int, epoch: int) -> None:
        """Sizes the slots from sample `first_index` (made by worker 0, or here with workers=0), maps and
        registers them, and tells the workers the layout."""
        self._device = device
        seed = sample_seed(self.seed, epoch, first_index)
        template, spec = self._probe(first_index, seed, epoch) if self.workers else self._probe_here(first_index, seed)
        self.template = template
        self._spec = spec
        self.layout = Layout(spec, self.batch_size, self.capacity)
        if self.small_chunk is not None and sum(leaf.nbytes for leaf in self.layout.leaves) <= SMALL_SAMPLE:
            self.chunk = self.small_chunk
        group = self.layout.group  # a chunk holds whole groups of a ragged leaf's samples (layout.py)
        self.chunk = -(-self.chunk // group) * group
        size = self.layout.slot_bytes * self.slots
        os.ftruncate(self._memfd, size)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.mapping is not None:  # a set-up whose prefetcher failed to open: mapped again at this size
            self.mapping.close()
            self.mapping = None
        self.mapping = SharedMapping(self._memfd, size)
        self._open_pipeline()
        for w in self.workers:
            self._send(w, ("layout", size, self.layout))
        # The workers hold their own descriptors: this one would only be inherited by processes forked
        # later, keeping the memory alive after close() for as long as they run. A layout with variable
        # leaves keeps it, to grow the slots (grow()).
        if not self.layout.variable:
            os.close(self._memfd)
            self._memfd = -1

    def _probe(self, first_index: int, seed: int, epoch: int) -> Tuple[Any, List[Spec]]:
        """The first sample's structure and leaves, from worker 0."""
        w = self.workers[0]
        self._send(w, ("probe", first_index, seed, epoch))
        self._probes += 1
        deadline = time.monotonic() + self.timeout
        msg: Any = None
        while self._probe_replies < self._probes:  # an interrupted set-up's reply comes first: skipped
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.fail(RuntimeError(
                    f"ferry Loader: worker 0 (pid {w.pid}, {ask_for_stack(w.pid)}) made no sample {first_index} "
                    f"within timeout={self.timeout} s{processes.not_started([w], self.start_method)}"))
            if multiprocessing.connection.wait([w.results, w.process.sentinel], min(left, 1.0)):
                msg = self._receive(w)
                if msg[0] == "spec" or (msg[0] == "error" and msg[1] == PROBE):
                    self._probe_replies += 1
        if msg[0] == "error":
            # The loader stays usable: the next iter() asks for the first sample again.
            raise rebuild_error(msg, f"in ferry Loader worker 0 (pid {w.pid}) at sample {first_index}, the first, "
                                     "which sizes the slots (raised by iter())")
        return msg[1], msg[2]

    def _probe_here(self, first_index: int, seed: int) -> Tuple[Any, List[Spec]]:
        """The first sample's structure and leaves, made in this process (workers=0)."""
        try:
            with self.fmt.random_state_kept():
                return self.fmt.spec(make(self.fmt, self.dataset, self.transform, first_index, seed))
        except Exception as e:
            # The loader stays usable: the next iter() makes the first sample again.
            note(e, f"raised by the dataset at sample {first_index}, the first, which sizes the slots, in this "
                    "process (ferry Loader with workers=0; raised by iter())")
            raise

    def _open_pipeline(self) -> None:
        """ferry's prefetcher over the slots (registered as pinned by it) and its slot-writable eventfd."""
        assert self.mapping is not None and self.layout is not None
        self.prefetcher = None
        self.prefetcher = SlotPrefetcher(self._device, self.mapping.address, self.layout.slot_bytes, self.slots,
                                         self.depth)

    def left_part_way(self) -> bool:
        """Whether the pipeline holds batches of an epoch left part-way (dispatched, not taken)."""
        return bool(self.batches) or self.taken != self.dispatch_next

    def new_pipeline(self) -> None:
        """A new prefetcher over the same slots (after an abandoned epoch): the old one holds batches the
        consumer may still use and batches never written."""
        try:
            self.drain()
        except BaseException:
            self._unsure = True  # Note [No chunk is lost] 5: the next drain syncs first
            raise
        self._release_all()  # the new pipeline's batch 0 reuses the first slot
        old, self.prefetcher = self.prefetcher, None
        if old is not None:
            old.close()
        self._open_pipeline()
        self.dispatch_next = self.taken = 0
        self.batches.clear()
        self._pending.clear()

    def grow(self, path: str, capacity: int) -> None:
        """Lays the slots out again with variable leaf `path`'s capacity raised to `capacity` (a sample
        past it was found): every chunk held is waited for, the holds are waited for, the memfd grows and
        is mapped again by this process and the workers, and a new prefetcher starts from batch 0 (the
        caller plans the epoch again from the batch that overflowed: Loader._next)."""
        assert self.layout is not None and self.mapping is not None and self._memfd >= 0
        try:
            self.drain()
        except BaseException:
            self._unsure = True  # Note [No chunk is lost] 5: the next drain syncs first
            raise
        self._release_all()
        self.capacity[path] = capacity
        self.layout = Layout(self._spec, self.batch_size, self.capacity)
        size = self.layout.slot_bytes * self.slots
        old, self.prefetcher = self.prefetcher, None
        if old is not None:
            try:
                old.stop()  # its copies done and the slots unregistered: before they are unmapped
            finally:
                old.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.mapping.close()
        self.mapping = None
        os.ftruncate(self._memfd, size)
        self.mapping = SharedMapping(self._memfd, size)
        self._open_pipeline()
        for w in self.workers:
            self._send(w, ("layout", size, self.layout))
        self.dispatch_next = self.taken = 0
        self.batches.clear()
        self._pending.clear()

    def drain(self) -> None:
        """Waits for every chunk a worker holds (its bytes go to a slot about to be reused)."""
        self._resync()
        for w in self.workers:
            while w.chunks:
                if not multiprocessing.connection.wait([w.results, w.process.sentinel], self.timeout):
                    raise self.fail(RuntimeError(
                        f"ferry Loader worker {w.id} (pid {w.pid}, {ask_for_stack(w.pid)}) did not finish its "
                        f"chunk within timeout={self.timeout} s{processes.not_started([w], self.start_method)}"))
                self._collect(w, self._receive(w))

    # ---- epochs ------------------------------------------------------------------------------------------

    def plan(self, k0: int, epoch: int, batches: List[List[int]]) -> None:
        """The current epoch: its batches are numbered from k0."""
        self._plan_k0, self._plan_epoch, self._plan_batches = k0, epoch, batches
        self._dispatch_end = k0 + len(batches)

    # ---- dispatch and completion ---------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Grants the batches whose slots are free (in order) and hands out chunks to idle workers."""
        assert self.prefetcher is not None
        while self.dispatch_next < self._dispatch_end and self.prefetcher.slot_writable(self.dispatch_next):
            k = self.dispatch_next
            if not self._release(k):
                break
            if k not in self.batches:
                i = k - self._plan_k0
                # (position, index); the worker derives the seed
                b = Batch(k, self._plan_epoch, i, list(enumerate(self._plan_batches[i])), self.chunk)
                self.batches[k] = b
                self._pending.append(b)
            self.dispatch_next = k + 1
        while self._pending:
            b = self._pending[0]
            while b.pending:
                w = min(self.workers[:self.active], key=lambda x: len(x.chunks))
                if len(w.chunks) >= MAX_OUTSTANDING:
                    return
                part = b.pending[0]
                self._chunk_ids += 1
                c = Chunk(self._chunk_ids, b, part)
                w.chunks[c.id] = c  # recorded before it is sent (Note [No chunk is lost] 1)
                b.state[part] = c.id
                b.pending.popleft()
                self._send(w, ("chunk", c.id, self.prefetcher.slot_offset(b.k), c.items, b.epoch))
            self._pending.popleft()

    # ---- Note [Holding a slot] -------------------------------------------------------------------------

    def hold(self, k: int, wait: Callable[[], None]) -> None:
        """Keeps batch k's host slot from being handed to the workers again (for batch k + slots) until
        wait() returns: called (on the thread that runs next()) just before that batch is granted, or
        before a new pipeline or close() reuses or frees the slots. For an adapter that reads a batch's host
        bytes after the prefetcher copied them (a GPU decode reading the encoded bytes in place): `wait`
        blocks until that reading is done (a CUDA event's synchronize). Raises RuntimeError when batch
        k + slots was already granted; hold_until_taken (set it before the first epoch) makes the engine
        grant batch j only after batch j - slots was taken, so that a hold registered when batch k is
        taken is always in time."""
        if k + self.slots < self.dispatch_next:
            raise RuntimeError(f"ferry Loader: batch {k}'s slot was already handed to batch {k + self.slots}")
        self.holds[k] = wait

    def slot_address(self, k: int) -> int:
        """The address of batch k's slot in this process's mapping (its leaves at layout.offsets from it)."""
        assert self.mapping is not None and self.prefetcher is not None
        return self.mapping.address + self.prefetcher.slot_offset(k)

    def _release(self, k: int) -> bool:
        """Whether batch k may be granted its slot now: the batch that held it before was taken (under
        hold_until_taken) and its hold, if any, has returned (waited here)."""
        before = k - self.slots
        if before < 0:
            return True
        if self.hold_until_taken and self.taken <= before:
            return False
        wait = self.holds.pop(before, None)
        if wait is not None:
            wait()
        return True

    def _release_all(self) -> None:
        """Waits for every hold (the slots are about to be reused from batch 0, or freed)."""
        error: Optional[BaseException] = None
        for k in sorted(self.holds):
            wait = self.holds.pop(k)
            try:
                wait()
            except BaseException as e:  # noqa: BLE001 - the others are waited for first
                error = error or e
        if error is not None:
            raise error

    def _collect(self, w: Worker, msg: Any) -> None:
        if msg[0] in ("ready", "spec", "synced") or msg[1] == PROBE:
            return  # a worker's start, a first-sample reply left by an interrupted set-up, an old sync
        c = w.chunks.get(msg[1])
        if msg[0] == "done":
            _, _, samples, nbytes, seconds, writing, cpu = msg
            w.write_seconds += writing
            w.samples += samples
            w.bytes += nbytes
            w.seconds += seconds
            w.cpu_seconds += cpu
        if c is None:
            self.dropped_replies += 1  # Note [No chunk is lost] 3
            return
        b = c.batch
        if b.state[c.part] == c.id:
            b.state[c.part] = _ANSWERED
        del w.chunks[c.id]
        if msg[0] == "error" and b.error is None:
            b.error = rebuild_error(msg, f"in ferry Loader worker {w.id} (pid {w.pid}) at sample {msg[3]} "
                                         f"(batch {b.number} of epoch {b.epoch}, position {msg[2]})")
        elif msg[0] == "grow" and (b.grow is None or msg[2] < b.grow[4]):
            _, _, position, _, path, argument, capacity, text = msg
            b.grow = (path, argument, capacity, text, position)
        self._ready(b)

    def _ready(self, b: Batch) -> None:
        """Marks batch b ready for the copy once all its parts are written."""
        if (not b.readied and b.error is None and b.grow is None and not b.pending and b.written()
                and self.batches.get(b.k) is b):
            assert self.prefetcher is not None and self.layout is not None
            if self.layout.variable and not b.longest:
                # Read before the copy may start (the slot is not reused before it), as the batch's view
                # of a padded leaf ends at its longest sample.
                slot = self.slot_address(b.k)
                for f, leaf in enumerate(self.layout.leaves):
                    if leaf.kind == PADDED:
                        b.longest[f] = max(read_int64s(slot + self.layout.lengths[f], len(b.items)), default=0)
            try:
                self.prefetcher.slot_ready(b.k)
            finally:
                b.readied = True  # also when Ctrl-C lands as the call returns: it was marked

    def pump(self, k: int) -> Batch:
        """Dispatches and collects until batch k is complete (or failed); returns it."""
        if not self.workers:
            return self._make_here(k)
        try:
            return self._pump(k)
        except BaseException:
            self._unsure = True  # Note [No chunk is lost] 5
            raise

    def _pump(self, k: int) -> Batch:
        self._resync()
        deadline = time.monotonic() + self.timeout
        while True:
            self._dispatch()
            for b in list(self.batches.values()):  # one left written but unmarked by an exception
                self._ready(b)
            b = self.batches.get(k)
            if b is not None and (b.readied or b.error is not None or b.grow is not None):
                break
            waits: List[Any] = [w.results for w in self.workers] + [w.process.sentinel for w in self.workers]
            assert self.prefetcher is not None
            if self.prefetcher.event_fd >= 0:
                waits.append(self.prefetcher.event_fd)
            left = deadline - time.monotonic()
            if left <= 0:
                what = f"{b.left()} samples left" if b is not None else "its slot never came free"
                holders = [w for w in self.workers if any(c.batch is b for c in w.chunks.values())]
                raise self.fail(RuntimeError(
                    f"ferry Loader: batch {k - self._plan_k0} of epoch {self._plan_epoch} was not made within "
                    f"timeout={self.timeout} s ({what}{self._show_holders(b)})"
                    f"{processes.not_started(holders, self.start_method)}"))
            self._absorb(multiprocessing.connection.wait(waits, min(left, 1.0)))
        # Whatever else finished meanwhile goes to the copier now, not at the next call.
        self._absorb(multiprocessing.connection.wait([w.results for w in self.workers], 0))
        self._dispatch()
        return b

    def _resync(self) -> None:
        """After an exception left it unknown whether a message or its reply crossed (Note [No chunk is
        lost] 5): each worker with chunks answers a sync, after which a chunk still recorded is lost and
        its part is handed out again; the parts left to hand out are rebuilt from the batches' states."""
        if not self._unsure:
            return
        self._sync_token += 1
        token = self._sync_token
        asked = [w for w in self.workers if w.chunks]
        for w in asked:
            self._send(w, ("sync", token))
        for w in asked:
            deadline = time.monotonic() + self.timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not multiprocessing.connection.wait([w.results, w.process.sentinel], left):
                    raise self.fail(RuntimeError(
                        f"ferry Loader worker {w.id} (pid {w.pid}, {ask_for_stack(w.pid)}) did not answer within "
                        f"timeout={self.timeout} s{processes.not_started([w], self.start_method)}"))
                msg = self._receive(w)
                if msg[0] == "synced" and msg[1] == token:
                    break
                self._collect(w, msg)
            for c in list(w.chunks.values()):
                del w.chunks[c.id]
                if c.batch.state[c.part] == c.id:
                    c.batch.state[c.part] = _UNSENT
        for b in self.batches.values():
            b.pending = collections.deque(j for j, s in enumerate(b.state) if s == _UNSENT)
        self._pending = collections.deque(
            b for _, b in sorted(self.batches.items()) if b.pending and b.error is None and not b.readied)
        self._unsure = False

    def _make_here(self, k: int) -> Batch:
        """Batch k made in this process (workers=0) into its slot, as a worker would: the same seeds, the
        same bytes; a dataset's exception is kept in the batch, as it is, with a note naming the sample."""
        assert self.prefetcher is not None and self.mapping is not None and self.layout is not None
        old = self.batches.get(k)
        if old is not None and old.readied:  # made before an exception left next() early
            return old
        i, epoch = k - self._plan_k0, self._plan_epoch
        b = Batch(k, epoch, i, list(enumerate(self._plan_batches[i])), max(1, len(self._plan_batches[i])))
        self.batches[k] = b
        self._release(k)
        self.dispatch_next = max(self.dispatch_next, k + 1)
        if not self.prefetcher.slot_writable(k, math.ceil(self.timeout * 1000)):
            raise self.fail(RuntimeError(f"ferry Loader: batch {i} of epoch {epoch}: its slot did not come free "
                                         f"within timeout={self.timeout} s"))
        if self._writer is None:
            self._writer = self.fmt.writer(self.layout, self.mapping.address, self.mapping.buffer())
        writer = self._writer
        position = index = -1
        try:
            with self.fmt.random_state_kept():
                writer.begin(self.prefetcher.slot_offset(k), 0, len(b.items))
                for position, index in b.items:
                    try:
                        sample = make(self.fmt, self.dataset, self.transform, index,
                                      sample_seed(self.seed, epoch, index))
                    except Exception:
                        writer.flush()  # a refusal of a sample before this one comes first
                        raise
                    writer.add(sample, index, position)
                writer.finish()
        except CapacityError as e:
            b.grow = (e.path, e.argument, e.capacity, str(e), position)
            return b
        except AtSample as e:
            error = e.error
            note(error, f"raised at sample {e.index} (batch {i} of epoch {epoch}, position {e.position}) in this "
                        "process (ferry Loader with workers=0)")
            b.error = error
            return b
        except Exception as e:
            note(e, f"raised at sample {index} (batch {i} of epoch {epoch}, position {position}) in this process "
                    "(ferry Loader with workers=0)")
            b.error = e
            return b
        b.state = [_ANSWERED] * len(b.parts)
        b.pending.clear()
        self._ready(b)
        return b

    def _show_holders(self, b: Optional[Batch]) -> str:
        """'; worker 1 (pid 12, state S, its Python stack on stderr) holds positions 6-7' for each worker that
        holds part of batch b, after asking it for its stack (SIGUSR1)."""
        if b is None:
            return ""
        out = []
        for w in self.workers:
            held = [c.items for c in w.chunks.values() if c.batch is b]
            if held:
                positions = ", ".join(f"{items[0][0]}-{items[-1][0]}" for items in held)
                out.append(f"worker {w.id} (pid {w.pid}, {ask_for_stack(w.pid)}) holds positions {positions}")
        if b.pending:
            out.append(f"{sum(len(b.parts[j]) for j in b.pending)} samples not yet handed to a worker")
        return "; " + "; ".join(out) if out else ""

    def _absorb(self, ready: List[Any]) -> None:
        assert self.prefetcher is not None
        fd = self.prefetcher.event_fd
        if fd >= 0 and fd in ready:
            try:
                os.read(fd, 8)
            except BlockingIOError:
                pass
        for w in self.workers:
            while w.results in ready and w.results.poll():
                self._collect(w, self._receive(w))
            if w.process.sentinel in ready and not w.results.poll():
                raise self._died(w, "while the loader ran")

    # ---- the rest ------------------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The workers' counters and the prefetcher's (see Loader.stats)."""
        out: Dict[str, Any] = {
            "slots": self.slots, "slot_bytes": self.layout.slot_bytes if self.layout is not None else 0, "workers": [
                {"id": w.id, "pid": w.pid, "samples": w.samples, "bytes": w.bytes, "seconds": w.seconds,
                 "cpu_seconds": w.cpu_seconds, "write_seconds": w.write_seconds} for w in self.workers]}
        if self.prefetcher is not None:
            out["prefetch"] = self.prefetcher.stats()
        elif self.final_stats is not None:
            out["prefetch"] = self.final_stats
        return out

    def close(self) -> None:
        """Stops the workers (SIGKILL for any that has not exited within a second), the prefetcher, and
        frees the shared memory."""
        try:
            processes.stop_workers(self.workers)
        finally:  # Ctrl-C during the joins still frees the memory, registration first
            self._free_memory()

    def _free_memory(self) -> None:
        pf = self.prefetcher
        try:
            try:
                self._release_all()  # a hold's reader is done with the slots before they are freed
            finally:
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
            if pf is not None:
                pf.stop()  # unregisters the slots: before they are unmapped
                self.final_stats = pf.stats()  # every copy counted, now that all are done
        finally:
            if pf is not None:
                self.prefetcher = None
                pf.close()
            if self.mapping is not None:
                self.mapping.close()
                self.mapping = None
            if self._memfd >= 0:
                os.close(self._memfd)
                self._memfd = -1
            self.batches.clear()
            self._pending.clear()
