"""A ferry group over the processes of a job, as ferry.torch's data-parallel pieces open it: through
torch.distributed's key-value store when torch.distributed is initialized, MPI under mpirun, or this
process alone."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .._device import Device
from .._native.comm import Comm


def _job(store: Any, rank: Optional[int], world_size: Optional[int]) -> Dict[str, Any]:
    """Where the group's processes meet: a torch Store (given, or torch.distributed's), MPI, or none."""
    import torch.distributed as dist
    if store is not None:
        if rank is None or world_size is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError("DataParallel(store=...): give rank= and world_size= too, or initialize "
                                 "torch.distributed")
            rank, world_size = dist.get_rank(), dist.get_world_size()
        return {"store": store, "rank": rank, "world_size": world_size}
    if dist.is_available() and dist.is_initialized():
        getter = getattr(dist.distributed_c10d, "_get_default_store", None)
        if getter is None:
            raise RuntimeError("this torch has no torch.distributed.distributed_c10d._get_default_store: pass "
                               "the store to DataParallel(store=..., rank=..., world_size=...)")
        return {"store": getter(), "rank": dist.get_rank(), "world_size": dist.get_world_size()}
    if any(os.environ.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK")):
        return {"bootstrap": "mpi"}
    if int(os.environ.get("WORLD_SIZE", "1") or "1") > 1:
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but torch.distributed is not initialized: call "
            "torch.distributed.init_process_group() (backend nccl on GPUs, gloo on CPU) before "
            "DataParallel(...); ferry finds the other processes through its store")
    return {"bootstrap": "single"}


class Group(Comm):
    """This process's rank of a ferry group on `dev` (collective: every process opens it at the same point
    of its program). Reuses torch.distributed's store when it is initialized (or the `store` given, with
    rank and world_size), else MPI under mpirun, else a group of this process alone. The collectives are
    ferry._native.comm.Comm's."""

    def __init__(self, dev: Device, *, timeout: float = 300.0, store: Any = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None) -> None:
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout={timeout!r}: expected a positive number of seconds")
        self.dev = dev
        job = _job(store, rank, world_size)
        if "store" in job:
            super().__init__(dev._native, timeout=timeout, store=job["store"], rank=int(job["rank"]),
                             world_size=int(job["world_size"]))
        else:
            super().__init__(dev._native, timeout=timeout, bootstrap=job["bootstrap"])
