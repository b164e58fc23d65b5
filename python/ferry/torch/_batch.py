"""The device side of a batch that ferry.torch's Prefetcher and Loader share: what crosses for a tensor
(DLPack, or its bytes where DLPack refuses its dtype), a tensor over a lent batch, and whether a batch's
device slot is still held by live tensors."""
from __future__ import annotations

import gc
from typing import Any, Optional, Tuple

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
