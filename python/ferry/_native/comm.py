"""ferry_comm: a group of processes and its collectives, opened through MPI, alone, or over a key-value
store that the processes share (torch.distributed's Store, or anything with its methods)."""
from __future__ import annotations

import ctypes
import itertools
import time
import functools
import json
from ctypes import byref, c_int, c_void_p
from typing import Any, Dict, List, Optional

from .._c import KV_ERASE_FN, KV_GET_FN, KV_SET_FN, CommHandle, KvStore, lib, take_string
from ._base import NativeObject
from .device import Device

@functools.lru_cache(maxsize=None)
def codecs() -> List[Dict[str, Any]]:
    """The library's registered codecs (ferry_comm_codecs_json): name, aliases, lossy, stateless (what
    Comm.all_reduce_mean takes), automatic, options (takes codec_options)."""
    out = c_void_p()
    lib.ferry_comm_codecs_json(byref(out))
    return json.loads(take_string(out))


_prefixes = itertools.count()  # groups opened over a store by this process, the same order on every rank


class StoreCallbacks:
    """A Store (set, get, delete_key, and check or add) behind ferry's key-value callbacks (struct
    ferry_kv_store). ferry calls them from its own threads; an exception is kept in `error` and raised with
    ferry's error.

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


class Comm(NativeObject[CommHandle]):
    """This process's rank of a ferry group on `device` (collective: every process opens it at the same
    point of its program): over `store` as rank `rank` of `world_size` when a store is given, else by
    `bootstrap` ("mpi" or "single"). `rank`, `world_size` and `backend` ("nccl" or "host") say what it is.

    Collectives take device addresses (ints) and a native stream handle, and are ordered on that stream.
    An error raised while the store's callbacks failed carries what the store said (with_store_error)."""

    def __init__(self, device: Device, *, timeout: float, bootstrap: str = "single", store: Any = None,
                 rank: int = 0, world_size: int = 1) -> None:
        self.device = device
        self._store: Optional[StoreCallbacks] = StoreCallbacks(store) if store is not None else None
        handle = CommHandle()
        try:
            if self._store is not None:
                prefix = f"ferry/{next(_prefixes)}".encode()
                lib.ferry_comm_open_store(device.handle, byref(self._store.struct), prefix, int(rank),
                                          int(world_size), float(timeout), byref(handle))
            else:
                lib.ferry_comm_open(device.handle, bootstrap.encode(), float(timeout), byref(handle))
        except Exception as e:
            raise self.with_store_error(e) from None
        super().__init__(handle)
        r, n = c_int(), c_int()
        lib.ferry_comm_rank(handle, byref(r), byref(n))
        self.rank, self.world_size = r.value, n.value
        self.backend: str = (lib.ferry_comm_backend(handle) or b"").decode()

    def _destroy(self, handle: CommHandle) -> None:
        lib.ferry_comm_destroy(handle)

    def with_store_error(self, e: BaseException) -> BaseException:
        """`e` with what the store said, when a store callback failed under it."""
        store_error = self._store.error if self._store is not None else None
        if isinstance(store_error, KeyboardInterrupt):
            return store_error  # a Ctrl-C while ferry waited on the store is the user's, not a failure
        if store_error is not None:
            return type(e)(f"{e} (the store said: {type(store_error).__name__}: {store_error})")
        return e

    def all_reduce(self, send: int, recv: int, count: int, *, dtype: str, op: str, stream: int) -> None:
        """recv = op over ranks of `count` elements of `dtype` ("f32", "i32", ...) at send."""
        lib.ferry_comm_all_reduce(self.handle, send, recv, count, dtype.encode(), op.encode(), stream)

    def broadcast(self, send: int, recv: int, count: int, *, dtype: str, root: int, stream: int) -> None:
        """recv on every rank = send of `root`."""
        lib.ferry_comm_broadcast(self.handle, send, recv, count, dtype.encode(), root, stream)

    def all_reduce_mean(self, data: int, count: int, *, codec: str, stream: int) -> None:
        """The mean over ranks of `count` fp32 elements at `data`, in place, through a stateless codec."""
        lib.ferry_comm_all_reduce_mean(self.handle, data, count, codec.encode(), stream)

    def abort(self, why: str) -> None:
        """Fails every process's pending and later collectives, naming `why`."""
        lib.ferry_comm_abort(self.handle, why.encode())
