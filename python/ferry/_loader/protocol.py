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
  ("synced", token)

Note [No chunk is lost]
A chunk is lost when the main process waits for a batch whose slot will never be marked ready although
no worker is working on it, nor dead, nor stuck: the hangs of issue 37 ("a chunk never answered; a fresh
Loader's first sample never made"). By construction it cannot happen:
1. Each chunk has an id never used again in the Loader's life. The main process records the chunk (its
   worker's table and its batch's set of unanswered ids) before it sends it, so a reply never precedes
   its record.
2. A worker answers every chunk message with exactly one reply naming the id ("done", or "error" after
   which it goes on with its next message), in the order of its task pipe; it answers nothing else with
   a chunk id. A pipe loses nothing and keeps order.
3. A reply removes its id from the batch first, then from the worker's table; a batch is marked ready
   when it has no unanswered id and no chunk left to hand out, checked again at every wait (a Ctrl-C
   between the two steps leaves a batch that the next wait readies). A reply whose id is not recorded
   (a chunk sent twice, a reply read twice) changes nothing: a batch counts ids, not replies.
4. Every recorded chunk is held by one live worker, which therefore replies (2), dies (its sentinel and
   EOF on its result pipe: the loader fails naming the chunk), or is stuck (the timeout: the loader
   fails naming the holders, their pid, state and positions, and has them print their stacks).
   The main process waits on every result pipe, every sentinel and the slot eventfd, at most a second at a
   time, and dispatches again after each wait: a wake-up it missed costs a second, not a batch.
5. A Ctrl-C (any exception) inside a send or a receive leaves it unknown whether the message was
   delivered or its reply taken. The loader then marks its workers unsure; before it waits again it
   sends each one with chunks a ("sync", token) and reads up to ("synced", token): the pipes keep order,
   so a chunk still recorded then was never delivered or its reply was dropped, and it is handed out
   again (same seeds, same bytes, into a slot not yet marked ready).
6. A slot is reused only after the chunks written into it are answered: a new pipeline (an epoch left
   part-way) drains every worker first. A chunk knows its batch object, not its number, so a reply from
   an old pipeline cannot count in a new one.
The two hangs seen were the same failure upstream of all this: a worker that never ran its chunk because
it was blocked on a lock in its first garbage collection, freeing a batch tensor inherited from the parent
whose release took a lock one of the parent's threads held at the fork (54ffdb5: ferry's C ABI leaves what
a fork child inherited alone, and a worker freezes what it inherited, ferry/_loader/worker.py). The
strided write made it likelier, not the cause: its ctypes arrays are objects the collector tracks, so
workers reached a collection sooner. tests/python/test_loader_protocol.py holds the cases.
"""
from __future__ import annotations

import sys
import traceback
from typing import Any, Tuple

PROBE = -1  # the id of the first sample's reply
INIT = -2  # the id of worker_init_fn's error
MAX_OUTSTANDING = 2  # chunks a worker holds at once


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
