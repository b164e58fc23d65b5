"""A ferry group over the processes of a job, as ferry.torch's data-parallel pieces open it: through
torch.distributed's key-value store when torch.distributed is initialized, MPI under mpirun, or this
process alone."""
from __future__ import annotations

import ctypes
import itertools
import os
import time
from ctypes import byref, c_int
from typing import Any, Dict, Optional

from .._c import KV_ERASE_FN, KV_GET_FN, KV_SET_FN, CommHandle, KvStore, lib
from .._device import Device

_prefixes = itertools.count()  # groups opened by this process, the same order on every rank


class _TorchStore:
    """torch.distributed's Store behind ferry's key-value callbacks (struct ferry_kv_store). ferry calls
    them from its own threads; an exception is kept and raised with ferry's error.

    ferry waits for a key in slices (an abort is seen within one). Store.check (torch >= 2.0) polls for a
    key; older stores have only wait(keys, timeout), and a TCPStore wait that times out leaves the
    server's late answer on the connection, where the next wait reads it as its own: that wait returns
    for a key that is not there and the get after it blocks (a hang seen under load on torch 1.13). There
    every key set also counts up a companion counter, and a wait polls it with add(counter, 0), which
    never blocks."""

    _READY = "/ferry-ready"  # the companion counter's suffix (old stores only)

    def __init__(self, store: Any) -> None:
        self._store = store
        self._check = getattr(store, "check", None)
        self.error: Optional[BaseException] = None
        self._set_fn = KV_SET_FN(self._set)
        self._get_fn = KV_GET_FN(self._get)
        self._erase_fn = KV_ERASE_FN(self._erase)
        self.struct = KvStore(None, self._set_fn, self._get_fn, self._erase_fn)

    def _set(self, user: Any, key: bytes, value: int, n: int) -> int:
        try:
            k = key.decode()
            self._store.set(k, ctypes.string_at(value, n) if n else b"")
            if self._check is None:
                self._store.add(k + self._READY, 1)
            return 0
        except BaseException as e:  # noqa: BLE001 - reported through ferry's status
            self.error = e
            return -1

    def _get(self, user: Any, key: bytes, out: int, n: int, wait_ms: int) -> int:
        k = key.decode()
        try:
            if not self._wait(k, max(int(wait_ms), 1) / 1000.0):
                return 1
            value = self._store.get(k)
            if len(value) != n:
                self.error = ValueError(f"store key {k!r} holds {len(value)} bytes, ferry expected {n}")
                return -1
            if n:
                ctypes.memmove(out, value, n)
            return 0
        except BaseException as e:  # noqa: BLE001
            self.error = e
            return -1

    def _wait(self, key: str, seconds: float) -> bool:
        """Whether `key` is in the store within `seconds`, by Store.check or, on stores without it, the
        key's companion counter (never store.wait with a timeout: see the class)."""
        deadline = time.monotonic() + seconds
        pause = 20e-6
        while not self._present(key):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 2e-3)
        return True

    def _present(self, key: str) -> bool:
        if self._check is not None:
            return bool(self._check([key]))
        return int(self._store.add(key + self._READY, 0)) > 0

    def _erase(self, user: Any, key: bytes) -> int:
        k = key.decode()
        try:
            self._store.delete_key(k)
            if self._check is None:
                self._store.delete_key(k + self._READY)
        except BaseException:  # noqa: BLE001 - a store that cannot erase keeps a few bytes
            pass
        return 0


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


class Group:
    """This process's rank of a ferry group on `dev` (collective: every process opens it at the same point
    of its program). Reuses torch.distributed's store when it is initialized (or the `store` given, with
    rank and world_size), else MPI under mpirun, else a group of this process alone."""

    def __init__(self, dev: Device, *, timeout: float = 300.0, store: Any = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None) -> None:
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout={timeout!r}: expected a positive number of seconds")
        self.dev = dev
        job = _job(store, rank, world_size)
        handle = CommHandle()
        self._store: Optional[_TorchStore] = None
        try:
            if "store" in job:
                self._store = _TorchStore(job["store"])
                prefix = f"ferry/{next(_prefixes)}".encode()
                lib.ferry_comm_open_store(dev.handle, byref(self._store.struct), prefix, int(job["rank"]),
                                          int(job["world_size"]), float(timeout), byref(handle))
            else:
                lib.ferry_comm_open(dev.handle, job["bootstrap"].encode(), float(timeout), byref(handle))
        except Exception as e:
            raise self.with_store_error(e) from None
        self.handle: Optional[CommHandle] = handle
        r, n = c_int(), c_int()
        lib.ferry_comm_rank(handle, byref(r), byref(n))
        self.rank, self.world_size = r.value, n.value
        self.backend = (lib.ferry_comm_backend(handle) or b"").decode()

    def with_store_error(self, e: BaseException) -> BaseException:
        """`e` with what the store said, when a store callback failed under it."""
        store_error = self._store.error if self._store is not None else None
        if isinstance(store_error, KeyboardInterrupt):
            return store_error  # a Ctrl-C while ferry waited on the store is the user's, not a failure
        if store_error is not None:
            return type(e)(f"{e} (the store said: {type(store_error).__name__}: {store_error})")
        return e

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            lib.ferry_comm_destroy(handle)
