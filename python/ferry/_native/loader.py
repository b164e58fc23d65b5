"""The Loader's native calls: the slot prefetcher over the shared slots (ferry_prefetch_create_slots and its
slot calls), the strided write of a sample into a slot, the raw mappings of the slots (libc mmap in the
main process, mmap in a worker), and the raw reads of random's and numpy's generators that the lazy seeding
compares (random_fingerprint, numpy_fingerprint). ferry/_loader/ and ferry/torch/_loader.py speak these objects; nothing
there imports ctypes or calls lib.ferry_*.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import random
import signal
from ctypes import addressof, byref, c_char, c_int, c_int64, c_size_t, c_uint64, c_void_p
from typing import Any, Callable, List, Optional, Sequence

from .. import _runtime
from .._c import PrefetchHandle, lib
from .device import Device
from .prefetch import Prefetch


class SlotPrefetcher(Prefetch):
    """ferry's prefetcher over `slots` slots of `slot_bytes` at `address` (registered as pinned by it),
    which other processes write in place: batch k is written once slot_writable(k) says so, then marked
    with slot_ready(k); next() lends the batches in order (Prefetch: next, released, stats, stop, close).

    The slot of batch k is the C++ slot feed's rule (ingest::slot_feed): slot_offset() asks it
    (ferry_prefetch_slot_offset) rather than restating it."""

    _what = "slot prefetcher"

    def __init__(self, device: Device, address: int, slot_bytes: int, slots: int, depth: int) -> None:
        h = PrefetchHandle()
        try:
            lib.ferry_prefetch_create_slots(device.handle, c_void_p(address), slot_bytes, slots, depth, byref(h))
        finally:
            if h:  # owned at once, even when Ctrl-C lands as the call returns
                super().__init__(h)
        self.device = device  # outlives the prefetcher
        self.slot_bytes, self.slots = slot_bytes, slots
        fd = c_int()
        lib.ferry_prefetch_slot_event_fd(h, byref(fd))
        self.event_fd: int = fd.value  # readable whenever a slot became writable; -1 if none

    def slot_offset(self, k: int) -> int:
        """The offset of batch k's slot in the slots' memory, as the library's feed places it."""
        out = c_size_t()
        lib.ferry_prefetch_slot_offset(self.handle, c_uint64(k), byref(out))
        return out.value

    def slot_writable(self, k: int, timeout_ms: int = 0) -> bool:
        """Whether batch k's slot may be written, waiting up to timeout_ms for it."""
        out = c_int()
        lib.ferry_prefetch_slot_wait(self.handle, c_uint64(k), c_int64(max(timeout_ms, 0)), byref(out))
        return bool(out.value)

    def slot_ready(self, k: int) -> None:
        """Batch k is written: the prefetcher may copy it."""
        lib.ferry_prefetch_slot_ready(self.handle, c_uint64(k))


def copy_strided(dst: int, src: int, shape: Sequence[int], byte_strides: Sequence[int], item: int) -> None:
    """Copies a strided array of `item`-byte elements at address `src` densely to `dst` (ferry_copy_strided:
    any strides; a channels-first view of channels-last bytes deinterleaved)."""
    ndim = len(shape)
    lib.ferry_copy_strided(dst, src, ndim, (c_int64 * ndim)(*shape), (c_int64 * ndim)(*byte_strides), item)


def fill_bytes(dst: int, value: int, nbytes: int) -> None:
    """Sets `nbytes` bytes at address `dst` to `value` (memset)."""
    ctypes.memset(dst, value, nbytes)


def read_int64s(address: int, count: int) -> List[int]:
    """`count` int64 values at `address` (native byte order)."""
    return list((c_int64 * count).from_address(address)) if count else []


def host_array(address: int, dtype: Any, count: int) -> Any:
    """A numpy array of `count` `dtype` elements over the memory at `address` (no copy; valid while that
    memory is: a slot of the main process's mapping)."""
    import numpy as np
    dt = np.dtype(dtype)
    return np.frombuffer((c_char * (count * dt.itemsize)).from_address(address), dtype=dt, count=count)


def copy_bytes(dst: int, src: int, nbytes: int) -> None:
    """Copies `nbytes` bytes from address `src` to `dst` (memmove)."""
    ctypes.memmove(dst, src, nbytes)


# ---- the lazy seeding's reads of the generators (ferry/torch/_samples.py) ----

def random_fingerprint() -> Optional[Callable[[], Any]]:
    """A cheap read of random's global generator that changes with every draw: CPython's Random object
    is {PyObject_HEAD; int index; uint32_t state[624]} (the index and a state word: any draw moves the
    index, and the 624th draw from an index regenerates the state), plus gauss()'s cached value. Checked
    against getstate() on a generator of its own; None where the layout differs (seeded every sample)."""
    try:
        head = object.__basicsize__
        probe = random.Random(12345)
        probe.random()
        state = probe.getstate()[1]
        index = ctypes.c_int.from_address(id(probe) + head)
        words = (ctypes.c_uint32 * 624).from_address(id(probe) + head + 4)
        if index.value != state[624] or tuple(words) != tuple(state[:624]):
            return None
        inst = random._inst  # type: ignore[attr-defined]
        words = (ctypes.c_char * 8).from_address(id(inst) + head)  # index and state[0]
        return lambda: (words.raw, inst.gauss_next)
    except Exception:  # noqa: BLE001 - anything unexpected: seed every sample
        return None


def numpy_fingerprint() -> Optional[Callable[[], Any]]:
    """The same for numpy's global RandomState: its MT19937's state {uint32 key[624]; int pos} through
    the bit generator's ctypes interface (checked against .state; pos and the word beside it are read).
    None where that differs."""
    try:
        import numpy as np
        rs = np.random.mtrand._rand
        bg = rs._bit_generator
        address = bg.ctypes.state_address
        state = bg.state["state"]
        key = (ctypes.c_uint32 * 624).from_address(address)
        pos = ctypes.c_int.from_address(address + 4 * 624)
        if pos.value != state["pos"] or list(key) != [int(x) for x in state["key"]]:
            return None
        words = (ctypes.c_char * 8).from_address(address + 4 * 623)  # state[623] and pos
        return lambda: (words.raw, rs, bg)  # (rs, bg: kept alive with the reads)
    except Exception:  # noqa: BLE001
        return None



class SharedMapping:
    """The main process's mapping of the slots: populated, and not inherited by processes forked later
    (MADV_DONTFORK: another loader's workers, a DataLoader's). mmap.mmap would keep a duplicate of the
    descriptor open, which those processes would inherit, keeping the memory alive after close() for as
    long as they run; this mapping keeps none."""

    def __init__(self, fd: int, size: int) -> None:
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

    def buffer(self) -> Any:
        """A writable buffer over the mapping (for the writes of Loader(workers=0)); not to be used after
        close()."""
        return (c_char * self.size).from_address(self.address)

    def close(self) -> None:
        # In a fork child (a copy of this object, collected there) the mapping is not inherited
        # (MADV_DONTFORK): the address range may hold something else of the child's.
        if self.address and self._pid == _runtime.current_pid():
            self._libc.munmap(self.address, self.size)
        self.address = 0

    def __del__(self) -> None:
        self.close()


class WorkerMapping:
    """A worker's mapping of the slots (its own, of the descriptor it was given): populated now, as the
    first write to each page would otherwise fault in every worker in the first batches (about 1 us a
    page, 10 ms a 38 MB batch)."""

    def __init__(self, fd: int, size: int) -> None:
        self._mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        anchor = c_char.from_buffer(self._mm)  # an export of the buffer, dropped at once: the map can close
        self.address: int = addressof(anchor)
        del anchor

    def buffer(self) -> Any:
        """A writable buffer over the mapping: the mmap (every view of it is released before close())."""
        return self._mm

    def close(self) -> None:
        self._mm.close()
        self.address = 0


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (Linux's PR_SET_PDEATHSIG; nothing
    elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
