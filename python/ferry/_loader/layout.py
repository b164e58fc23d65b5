"""Where a batch's bytes lie in a slot (framework-neutral).

A sample is a structure of leaves (tensors, arrays, numbers), each with a path ("sample[0]"), a dtype, a
shape and its bytes; the first sample of an epoch's first batch gives them (its spec). In a slot, leaf f
of the batch occupies batch_size * its bytes from a 256-aligned offset, sample j at j * its bytes; a
slot is a whole number of pages. Every sample has the first one's leaves (the fixed layout, the only kind
today: a layout for samples of varying size would give each leaf a capacity and record each sample's
length beside its bytes, and keep the same interface: offsets, slot_bytes, place()).
"""
from __future__ import annotations

import math
import mmap
from typing import Any, List, NamedTuple, Sequence, Tuple

ALIGN = 256
PAGE = mmap.PAGESIZE


class Leaf(NamedTuple):
    path: str
    dtype: Any  # the framework's dtype (a torch.dtype): the layout only carries it
    shape: Tuple[int, ...]
    nbytes: int  # one sample's


class Spec(NamedTuple):
    """A leaf of the first sample as a worker reports it: path, dtype, shape and the bytes of one element."""
    path: str
    dtype: Any
    shape: Tuple[int, ...]
    itemsize: int


class Layout:
    """The places of a batch's leaves in a slot of slot_bytes (see the module)."""

    def __init__(self, spec: Sequence[Spec], batch_size: int) -> None:
        self.batch_size = batch_size
        self.leaves: List[Leaf] = []
        self.offsets: List[int] = []
        offset = 0
        for s in spec:
            leaf = Leaf(s.path, s.dtype, tuple(s.shape), s.itemsize * math.prod(s.shape))
            offset = (offset + ALIGN - 1) // ALIGN * ALIGN
            self.leaves.append(leaf)
            self.offsets.append(offset)
            offset += leaf.nbytes * batch_size
        self.slot_bytes = max(PAGE, (offset + PAGE - 1) // PAGE * PAGE)

    def place(self, f: int, position: int) -> int:
        """The offset in a slot of leaf f of the sample at `position` of the batch."""
        return self.offsets[f] + position * self.leaves[f].nbytes
