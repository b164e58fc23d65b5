"""Where a batch's bytes lie in a slot (framework-neutral).

A sample is a structure of leaves (tensors, arrays, numbers, byte strings), each with a path
("sample[0]"), a dtype, a shape and its bytes; the first sample of an epoch's first batch gives them (its
spec). In a slot each leaf has a region from a 256-aligned offset; a slot is a whole number of pages.
A leaf is one of three kinds:

- fixed: every sample has the first one's shape; sample j at j * its bytes (the batch is [B, *shape]).
- padded (a tensor or array whose leading dimension varies, declared by the adapter): each sample has
  room for `capacity` rows of the first sample's row shape (sample j at j * capacity * row bytes, the rows
  past its length filled with the pad value by the worker), then int64 lengths[B] (rows).
- ragged (bytes, or a 1-D tensor or array declared so): a byte slab of batch_size * capacity bytes, then
  int64 offsets[B] and int64 lengths[B] (bytes, from the slab's start). The batch's positions are cut in
  groups of GROUP (8) samples; group [p, p + 8) owns the slab's bytes [p * capacity, (p + 8) * capacity)
  and its samples are packed there in order: `capacity` is the bytes per sample on average over a group.
  A chunk holds whole groups (the engine rounds the chunk up to a multiple of GROUP), so workers write
  their groups in parallel with no coordination, and a batch's bytes depend neither on the timing nor on
  the workers or the chunk (a batch smaller than a group is one group).

A sample past its leaf's capacity (more rows, or more bytes than its group's room) raises CapacityError
before anything of it is written; the engine then lays the slots out again with the capacity it names
(Engine.grow) and the batch is made again.

The lengths and offsets are written by the worker beside the sample's bytes, so they reach the device in
the same copy as the rest of the slot.
"""
from __future__ import annotations

import math
import mmap
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

ALIGN = 256
PAGE = mmap.PAGESIZE
FIXED, PADDED, RAGGED = "fixed", "padded", "ragged"
RAGGED_MIN = 4096  # the default capacity of a ragged leaf is at least this (bytes per sample)
PADDED_MIN = 16  # and of a padded leaf (rows)
GROUP = 8  # a ragged leaf's room is shared by groups of this many samples


class Leaf(NamedTuple):
    path: str
    dtype: Any  # the framework's dtype (a torch.dtype): the layout only carries it
    shape: Tuple[int, ...]  # a sample's region: fixed, its shape; padded (capacity, *row); ragged (capacity,)
    nbytes: int  # one sample's region (ragged: the capacity, bytes per sample on average)
    kind: str = FIXED
    itemsize: int = 1
    capacity: int = 0  # padded: rows; ragged: bytes per sample on average; fixed: 0


class Spec(NamedTuple):
    """A leaf of the first sample as a worker reports it: path, dtype, shape (ragged: (its bytes,)), the
    bytes of one element, and its kind (FIXED, PADDED, RAGGED)."""
    path: str
    dtype: Any
    shape: Tuple[int, ...]
    itemsize: int
    kind: str = FIXED


class CapacityError(ValueError):
    """A sample past a variable leaf's capacity (raised before anything of it is written): the leaf's
    `path`, its `argument` ("ragged" or "pad") and the `capacity` that admits it (the engine lays the
    slots out again with it)."""

    def __init__(self, message: str, path: str, argument: str, capacity: int) -> None:
        super().__init__(message)
        self.path, self.argument, self.capacity = path, argument, capacity


def default_capacity(s: Spec) -> int:
    """A variable leaf's capacity when none is given, from the first sample: ragged, twice its bytes and at
    least RAGGED_MIN, rounded up to 256; padded, twice its leading length and at least PADDED_MIN rows."""
    if s.kind == RAGGED:
        return max(RAGGED_MIN, (2 * s.shape[0] * s.itemsize + ALIGN - 1) // ALIGN * ALIGN)
    return max(PADDED_MIN, 2 * s.shape[0])


class Layout:
    """The places of a batch's leaves in a slot of slot_bytes (see the module). `capacity` maps a variable
    leaf's path to its capacity (default_capacity() for those it leaves out)."""

    def __init__(self, spec: Sequence[Spec], batch_size: int, capacity: Optional[Dict[str, int]] = None) -> None:
        self.batch_size = batch_size
        self.leaves: List[Leaf] = []
        self.offsets: List[int] = []  # each leaf's data
        self.lengths: List[int] = []  # each variable leaf's int64 lengths[B] (-1 for a fixed leaf)
        self.starts: List[int] = []  # each ragged leaf's int64 offsets[B] (-1 otherwise)
        capacity = capacity or {}
        offset = 0

        def take(nbytes: int) -> int:
            nonlocal offset
            at = (offset + ALIGN - 1) // ALIGN * ALIGN
            offset = at + nbytes
            return at

        for s in spec:
            if s.kind == FIXED:
                leaf = Leaf(s.path, s.dtype, tuple(s.shape), s.itemsize * math.prod(s.shape), FIXED, s.itemsize)
            else:
                cap = capacity.get(s.path) or default_capacity(s)
                if s.kind == PADDED:
                    shape = (cap, *s.shape[1:])
                    leaf = Leaf(s.path, s.dtype, shape, s.itemsize * math.prod(shape), PADDED, s.itemsize, cap)
                else:
                    cap = (cap + s.itemsize - 1) // s.itemsize * s.itemsize  # whole elements
                    leaf = Leaf(s.path, s.dtype, (cap,), cap, RAGGED, s.itemsize, cap)
            self.leaves.append(leaf)
            self.offsets.append(take(leaf.nbytes * batch_size))
            self.starts.append(take(8 * batch_size) if leaf.kind == RAGGED else -1)
            self.lengths.append(take(8 * batch_size) if leaf.kind != FIXED else -1)
        self.variable = any(leaf.kind != FIXED for leaf in self.leaves)
        self.group = GROUP if any(leaf.kind == RAGGED for leaf in self.leaves) else 1  # chunks hold whole groups
        self.slot_bytes = max(PAGE, (offset + PAGE - 1) // PAGE * PAGE)

    def place(self, f: int, position: int) -> int:
        """The offset in a slot of leaf f of the sample at `position` of the batch (a ragged leaf: the start
        of the chunk region a chunk starting at `position` owns)."""
        return self.offsets[f] + position * self.leaves[f].nbytes
