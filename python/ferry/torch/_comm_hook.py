"""ferry's codecs inside PyTorch's own DistributedDataParallel, for users who keep DDP:

    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    ddp.register_comm_hook(None, ferry.torch.comm_hook("bf16"))

DDP keeps its buckets, its hooks and its order; each bucket's average goes through ferry's group instead
of torch's process group: "none" (an fp32 average), "bf16" or "fp16" (scaled by 1/world size and cast in one
fused pass, summed on the wire in 16 bits, cast back: half the bytes; the error bound is
ferry/comm/codec.hpp's). The bucket is reduced in place on the current stream, and the hook returns a
future already complete on that stream, so DDP's copy-out (or the optimizer, with gradient_as_bucket_view)
runs after it with no host synchronization. ferry's group is a second communicator beside DDP's; its
collectives run only inside backward, where DDP issues none of its own (DDP's broadcasts run in forward),
so the two never interleave. For DataParallel's own bucketing and automatic plan, see
ferry.torch.DataParallel.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .. import _runtime
from .._native.comm import codecs
from ._common import resolve_device
from ._group import Group


class comm_hook:  # noqa: N801 - used as a function: ddp.register_comm_hook(None, ferry.torch.comm_hook("bf16"))
    """A DDP comm hook reducing each bucket through ferry with `codec` ("none", "bf16", "fp16"). Opens
    ferry's group at once (collective: call it on every rank at the same point, after
    torch.distributed.init_process_group); `device`: the device of the model's gradients (default: the
    current CUDA device, or the host backend on CPU)."""

    def __init__(self, codec: str = "bf16", *, device: Any = None, timeout: float = 300.0,
                 store: Any = None, rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
        # The library's codec registry owns the names: a stateless codec serves every bucket (a codec that
        # keeps state per gradient matrix, as PowerSGD, needs DataParallel's reducer).
        names = {alias: c["name"] for c in codecs() if c["stateless"] for alias in [c["name"], *c["aliases"]]}
        if codec not in names:
            stateful = [c["name"] for c in codecs() if not c["stateless"]]
            raise ValueError(f"comm_hook codec {codec!r}: expected one of {', '.join(sorted(names))} "
                             f"({', '.join(stateful)} keep state per gradient matrix: use "
                             "DataParallel(lossy=True) for ferry's)")
        self.codec = names[codec]
        self._dev = resolve_device(device)
        self._cuda = self._dev.backend == "cuda"
        self._group = Group(self._dev, timeout=timeout, store=store, rank=rank, world_size=world_size)
        self._host_stream = None if self._cuda else self._dev.default_stream()
        self._pid = _runtime.current_pid()
        self.__name__ = self.__qualname__ = f"ferry_{self.codec}_hook"  # DDP logs the hook by name
        _runtime.register(self)

    # No annotations: DDP's register_comm_hook checks them against dist.GradBucket and Future objects,
    # which postponed (string) annotations are not.
    def __call__(self, state, bucket):  # type: ignore[no-untyped-def]
        _runtime.check_owner(self, self._pid)
        if self._group.closed:
            raise RuntimeError("ferry.torch.comm_hook: closed")
        buf = bucket.buffer()
        if buf.dtype != torch.float32:
            raise ValueError(f"ferry.torch.comm_hook: bucket {bucket.index()} holds {buf.dtype}; ferry's codecs "
                             "take float32 gradients")
        if self._cuda:
            if buf.device.type != "cuda" or buf.device.index != self._dev.ordinal:
                raise ValueError(f"ferry.torch.comm_hook: bucket on {buf.device}, the hook's group is on "
                                 f"cuda:{self._dev.ordinal} (pass device=)")
            stream = int(torch.cuda.current_stream(buf.device).cuda_stream)
            self._group.all_reduce_mean(buf.data_ptr(), buf.numel(), codec=self.codec, stream=stream)
            fut = torch.futures.Future(devices=[buf.device])
        else:
            if buf.device.type != "cpu":
                raise ValueError(f"ferry.torch.comm_hook: bucket on {buf.device}, the hook's group is on ferry's "
                                 "host backend (CPU tensors); make the hook with device= the model's GPU")
            self._group.all_reduce_mean(buf.data_ptr(), buf.numel(), codec=self.codec, stream=self._host_stream.handle)
            self._host_stream.synchronize()
            fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    def close(self) -> None:
        """Releases ferry's group (at exit, or once DDP no longer calls the hook)."""
        if _runtime.current_pid() == self._pid:
            self._group.close()
