"""The order of a Loader's samples: each epoch's dataset indices for this rank, cut into batches, and the
seeds every sample is made under (framework-neutral; numpy for the shuffle).

Epoch e's order is a permutation seeded by (seed, e) when shuffled, else 0..n-1; with world_size > 1 each
rank takes every world_size-th index of it, padded by wrapping to a multiple of world_size as
DistributedSampler does. A sampler (any iterable of indices) gives the order instead. Sample i of epoch e
is made under sample_seed(seed, e, i): the same whichever worker makes it.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Iterable, List, Optional

MASK = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of dataset index `index` in epoch `epoch` of a loader seeded `seed`: the same whichever
    worker runs it, however many workers there are (ferry's C++ loader's sample_seed)."""
    return _mix64((_mix64((_mix64(seed & MASK) + epoch) & MASK) + index) & MASK)


def epoch_seed(seed: int, epoch: int) -> int:
    """The part of sample_seed(seed, epoch, index) that does not depend on the index (a chunk's workers
    compute it once): sample_seed(seed, epoch, i) == index_seed(epoch_seed(seed, epoch), i)."""
    return _mix64((_mix64(seed & MASK) + epoch) & MASK)


def index_seed(base: int, index: int) -> int:
    return _mix64((base + index) & MASK)


def worker_seed(seed: int, wid: int) -> int:
    """Worker `wid`'s own seed: what random, numpy and torch hold while worker_init_fn runs, and the `seed`
    of torch.utils.data.get_worker_info() there (DataLoader's per-worker base seed); fixed for the
    worker's life, while each sample is made under its own sample_seed. Below 2**63, as DataLoader's (an
    int64 holds it)."""
    return _mix64(((_mix64(seed & MASK) ^ 0x776F726B6572) + wid) & MASK) >> 1  # "worker": apart from sample seeds


def sampled_index(i: Any, position: int, n: int) -> int:
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


class Order:
    """The batches of each epoch of `dataset` (see the module): its length is read at each epoch's start;
    len() counts the batches of the length it had when the Order was made."""

    def __init__(self, dataset: Any, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool, rank: int,
                 world_size: int, sampler: Optional[Iterable[Any]]) -> None:
        self.dataset, self.n = dataset, len(dataset)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.drop_last, self.rank, self.world_size, self.sampler = drop_last, rank, world_size, sampler

    def indices(self, epoch: int) -> List[int]:
        """Epoch `epoch`'s dataset indices for this rank, in order."""
        n = len(self.dataset)
        if self.sampler is not None:
            return [sampled_index(i, position, n) for position, i in enumerate(self.sampler)]
        if self.shuffle:
            import numpy as np
            order = np.random.default_rng([self.seed & MASK, epoch]).permutation(n).tolist()
        else:
            order = list(range(n))
        if self.world_size > 1:
            total = math.ceil(n / self.world_size) * self.world_size
            order += (order * math.ceil(total / n))[:total - n]  # pad by wrapping, as DistributedSampler
            order = order[self.rank::self.world_size]
        return order

    def batches(self, epoch: int) -> List[List[int]]:
        """Epoch `epoch`'s batches of dataset indices (a short last one dropped with drop_last)."""
        order = self.indices(epoch)
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __len__(self) -> int:
        """Batches per epoch on this rank (with a sampler: of len(sampler) indices)."""
        samples = math.ceil(self.n / self.world_size)
        if self.sampler is not None:
            if not hasattr(self.sampler, "__len__"):
                raise TypeError(f"Loader over a sampler without len() (a {type(self.sampler).__name__}) has no len()")
            samples = len(self.sampler)
        full, rest = divmod(samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def set_epoch(self, epoch: int) -> None:
        """Passes the next epoch's number to a sampler that has a set_epoch (a DistributedSampler)."""
        if self.sampler is not None and callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)
