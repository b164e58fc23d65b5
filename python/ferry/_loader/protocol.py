"""The messages between a Loader's main process and its workers (multiprocessing pipes, pickled tuples,
one task pipe and one result pipe per worker), and why no chunk can be lost.

To a worker:
  ("probe", index, seed, epoch)          make the first sample; answer its structure (the layout's source)
  ("layout", size, layout)               map the slots (size bytes of the memfd), write by `layout`
  ("chunk", id, slot_offset, items, epoch)  write samples [(position, index), ...] into the slot there
  ("sync", token)                        answer ("synced", token): every earlier message has been answered
  None                                   exit
From a worker:
  ("ready",)                             first: it got past its start (unpickling; under spawn or
                                         forkserver, the main module's import)
  ("spec", template, [Spec, ...])        the first sample's structure and leaves
  ("done", id, samples, bytes, seconds, write_seconds, cpu_seconds)
  ("error", id, position, index, type module, type name, message, traceback text)
                                         id PROBE for the first sample, INIT for worker_init_fn (the
                                         worker then exits)
  ("grow", id, position, index, path, argument, capacity, message)
                                         a sample past a variable leaf's capacity (layout.CapacityError):
                                         the engine lays the slots out again with `capacity` and makes
                                         the batch again (an answer to chunk `id`, as "done" and "error")
  ("synced", token)

Note [No chunk is lost]
A chunk is lost when the main process waits for a batch whose slot will never be marked ready although
no worker is working on it, nor dead, nor stuck: what the two hangs of issue 37 looked like ("a chunk
never answered; a fresh Loader's first sample never made"). By construction it cannot happen:
1. Each chunk has an id used once in the Loader's life and carries one part of one batch. The main
   process records it (in its worker's table, and as the part's holder) before it sends it, so a reply
   never precedes its record.
2. A worker answers every chunk message with exactly one reply naming the id ("done", or "error" after
   which it goes on with its next message), in the order of its task pipe, and nothing else carries a
   chunk id. A pipe loses nothing and keeps order.
3. A reply marks its part written, then drops the id from the worker's table. A batch is marked ready
   when every part is written and none is left to hand out, checked again before every wait (an
   exception between the steps leaves a batch the next wait readies). A reply whose id is not recorded
   (a chunk that went twice down a pipe, a reply of an old pipeline) changes nothing: a batch counts its
   parts, not replies. The loader itself never sends a part again while it may still be written: only
   after a sync (5) showed its chunk lost.
4. Every recorded chunk is held by one live worker, which therefore replies (2), dies (its sentinel and
   EOF on its result pipe: the loader fails at once naming the chunk), or is stuck (the timeout: the
   loader fails naming the holders, their pid, state and positions, and has them print their Python
   stacks). The main process waits on every result pipe, every sentinel and the slot eventfd, at most a
   second at a time, and dispatches again after each wait: a wake-up it missed costs a second, not a batch.
5. An exception (Ctrl-C) inside a send or a receive leaves it unknown whether the message went, or
   whether a reply was taken from its pipe and dropped. The loader then counts itself unsure; before it
   waits again it sends each worker that holds chunks a ("sync", token) and reads up to ("synced",
   token). The pipes keep order, so a chunk still recorded then was never delivered or its reply was
   dropped: its part is handed out again (the same seeds, the same bytes, into a slot not yet ready).
   The parts left to hand out are rebuilt from the parts' states, not from what the interrupted code
   had done.
6. A slot is reused only after every chunk written into it is answered: a new pipeline (after an epoch
   left part-way) drains every worker first. A chunk knows its batch object, not the batch's number, so
   a reply from an old pipeline cannot count in a new one, whose numbers start again at 0.
The two hangs seen were upstream of all this, in a worker that never finished its chunk or its first
sample because it waited on a lock (found in 54ffdb5): a garbage collection in the worker freed a batch
tensor inherited from the parent (garbage the parent still held at the fork: a batch of an earlier
Loader, say), whose release took the prefetcher's locks, which one of the parent's threads may have held
at the fork and which then stay held for ever in the child. Both symptoms are that wait. Since then ferry's C ABI leaves what a fork child inherited
alone (drop_hold, fork_generation), and a worker freezes what it inherited before any collection
(ferry/_loader/worker.py; tests/python/test_loader.py's
test_a_worker_runs_no_finalizer_of_what_it_inherited fails without the freeze). Why the hangs came with
the strided write is not established (both writes allocate objects that the collector counts, so it
changes only when a worker's first full collection comes): the write was put back after the fix and
has run since without a hang.
tests/python/test_loader_protocol.py holds the edge cases: a worker dying mid-chunk, a chunk sent twice, a
reply taken by an exception, an interrupted send, close while workers hold chunks.
"""
from __future__ import annotations

import sys
import traceback
from typing import Any, Tuple

PROBE = -1  # the id of the first sample's reply
INIT = -2  # the id of worker_init_fn's error
MAX_OUTSTANDING = 2  # chunks a worker holds at once


def grow_message(chunk: int, position: int, index: int, e: Any) -> Tuple[Any, ...]:
    """The answer to a chunk with a sample past a variable leaf's capacity (a layout.CapacityError)."""
    return ("grow", chunk, position, index, e.path, e.argument, e.capacity, str(e))


def error_message(chunk: int, position: int, index: int, e: BaseException) -> Tuple[Any, ...]:
    return ("error", chunk, position, index, type(e).__module__, type(e).__qualname__, str(e),
            "".join(traceback.format_exception(type(e), e, e.__traceback__)))


class _Verbatim(str):
    def __repr__(self) -> str:
        return str(self)


def rebuild_error(msg: Tuple[Any, ...], where: str) -> BaseException:
    """The worker's exception of an "error" message, rebuilt in this process: its own type when that can
    be made from one message, else RuntimeError, with the worker's traceback in the message."""
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
