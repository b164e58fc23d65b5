"""The device side of a batch that ferry.torch's Prefetcher and Loader share: what crosses for a tensor
(DLPack, or its bytes where DLPack refuses its dtype), a tensor over a lent batch, and whether a batch's
device slot is still held by live tensors."""
from __future__ import annotations

import gc
from typing import Any, List, NamedTuple, Optional, Tuple

from .._native.dlpack import TensorInfo
from .._native.prefetch import Batch, Prefetch
from ._common import tensor_info


def crossing(where: str, t: Any) -> Tuple[Any, TensorInfo, Optional[Tuple[Any, Tuple[int, ...]]]]:
    """What crosses for tensor `t`: itself, or, where DLPack refuses its dtype (bool on torch < 2), its
    bytes, to be viewed as the dtype again on the device (zero copy both ways)."""
    import torch
    if t.dtype != torch.bool:
        try:
            return t, tensor_info(t, None), None
        except (RuntimeError, TypeError, BufferError) as e:
            refused: BaseException = e
    else:
        refused = RuntimeError("bool")
    if not t.is_contiguous():
        raise ValueError(f"{where} ({t.dtype}, shape {list(t.shape)}) is not contiguous; make the dataset or "
                         "collate_fn return contiguous tensors")
    try:
        raw = t.reshape(-1).view(torch.uint8)
        return raw, tensor_info(raw, None), (t.dtype, tuple(t.shape))
    except (RuntimeError, TypeError, BufferError) as e:
        raise ValueError(f"{where} ({t.dtype}) cannot cross to the device: DLPack refuses it ({refused}) and "
                         f"its bytes cannot be viewed ({e}); convert it in the dataset or collate_fn") from None


def slot_still_held(prefetch: Prefetch, number: int, depth: int) -> bool:
    """Whether batch `number` would go into the device slot of batch number - depth while tensors of that
    batch are still alive (after a garbage collection, which frees those only held by a cycle)."""
    held = number - depth
    if held < 0:
        return False
    for attempt in range(2):
        if prefetch.released(held):
            return False
        if attempt == 0:
            gc.collect()  # tensors of that batch may only be waiting in a reference cycle
    return True


def batch_tensor(b: Batch, offset: int, shape: Tuple[int, ...], dtype: Tuple[int, int, int],
                 restore: Optional[Tuple[Any, Tuple[int, ...]]]) -> Any:
    """A torch tensor viewing `offset` of lent batch `b` (DLPack; it holds the batch until freed) of
    `shape` and DLPack dtype (code, bits, lanes), then viewed as restore's (dtype, shape) when given."""
    import torch.utils.dlpack
    t = b.tensor(offset, shape, dtype, torch.utils.dlpack.from_dlpack)
    if restore is not None:
        t = t.view(restore[0]).reshape(restore[1])
    return t


class Padded(NamedTuple):
    """A padded leaf of a Loader batch (Loader(pad=...)): `data` is [B, L, ...], L the batch's longest
    sample, each sample's rows past its length filled with the pad value (what
    torch.nn.utils.rnn.pad_sequence(batch_first=True) makes); `lengths` int64[B] their lengths. Both on
    the batch's device, views of its slot: `data` keeps the slot's row stride (its capacity), so it is
    contiguous only when L is the capacity (.contiguous() makes it so). Unpacks as (data, lengths)."""
    data: Any
    lengths: Any


class RaggedBatch:
    """A ragged leaf of a Loader batch (bytes samples, or Loader(ragged=...)): each sample's bytes in one
    flat uint8 tensor `data` at `offsets[i]` for `lengths[i]` bytes (int64[B] each; a sample's bytes are
    contiguous, the samples in order, with gaps, which hold whatever was there, between the groups of 8
samples that share a room: ferry/_loader/layout.py). All three are views
    of the batch's slot on its device, valid as long as the batch's tensors are (see Loader). `dtype` is
    the samples' element type (uint8 for bytes). len() is B; [i] is sample i's elements (a view of `data`
    as dtype); tolist() copies each sample's bytes to the host as bytes."""
    __slots__ = ("data", "offsets", "lengths", "dtype")

    def __init__(self, data: Any, offsets: Any, lengths: Any, dtype: Any) -> None:
        self.data, self.offsets, self.lengths, self.dtype = data, offsets, lengths, dtype

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def _spans(self) -> List[Tuple[int, int]]:
        return list(zip(self.offsets.tolist(), self.lengths.tolist()))

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"RaggedBatch indices are integers, not {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"RaggedBatch index {i} out of range for {n} samples")
        i %= n
        start, length = int(self.offsets[i]), int(self.lengths[i])
        view = self.data[start:start + length]
        return view if view.dtype == self.dtype else view.view(self.dtype)

    def tolist(self) -> List[bytes]:
        """Each sample's bytes, copied to the host."""
        host = self.data.cpu()
        return [bytes(host[o:o + n].numpy().tobytes()) for o, n in self._spans()]

    def __repr__(self) -> str:
        return (f"RaggedBatch({len(self)} samples of {str(self.dtype).replace('torch.', '')}, "
                f"{int(self.lengths.sum()) if len(self) else 0} bytes, on {self.data.device})")
