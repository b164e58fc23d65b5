"""The gradient reducer (include/ferry/c/ferry.h's ferry_reducer_*) as a native object, and its gradient
hooks in C.

The reducer owns the bucket plan: which bucket each gradient is in, when a bucket is full, and when it
goes out. Its caller (ferry.torch.DataParallel) says when a step opens (`begin_step`), when its backward
starts (`arm`) and when it ends (`finish`); in between, each gradient's completion reaches the library
without any Python code running: `hooks(count)` gives one callable per gradient, a C function of the
library bound to the reducer and the gradient's index (functools.partial over a ctypes function), which
the framework calls as it calls any hook. The library counts each bucket's gradients and launches the
bucket once it is full (Note [Gradient hooks in C] in docs/COMM.md).

The hooks are called through ctypes.PyDLL, which keeps the GIL held: a ctypes.CDLL call releases it, and
another Python thread (a loader's, a logger's) could then keep it for up to the interpreter's switch
interval (5 ms) at every gradient. What a hook does in the library is short; the one that fills a bucket
launches its collective, which waits (GIL held, other Python threads stalled) only when the communicator
already has its whole window of collectives in flight, or while a nonblocking NCCL communicator connects.
"""
from __future__ import annotations

import ctypes
import functools
import json
from ctypes import byref, c_int, c_int64, c_size_t, c_uint8, c_uint64, c_void_p, py_object
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from .._c import ReducerHandle, lib, library_path, take_string
from ._base import NativeObject
from .dlpack import make_capsule

T = TypeVar("T")

_pydll: Optional[Tuple[Any, Any]] = None


def _hook_functions() -> Tuple[Any, Any]:
    """ferry_reducer_grad_hook and ferry_reducer_grad_node_hook as a framework calls them: the reducer's
    address and the gradient's index (bound by the caller), then the framework's own arguments, taken as
    Python objects and ignored; through PyDLL (the GIL stays held)."""
    global _pydll
    if _pydll is None:
        dll = ctypes.PyDLL(library_path)
        tensor_hook = dll.ferry_reducer_grad_hook
        tensor_hook.restype = None
        tensor_hook.argtypes = [c_void_p, c_size_t, py_object]
        node_hook = dll.ferry_reducer_grad_node_hook
        node_hook.restype = None
        node_hook.argtypes = [c_void_p, c_size_t, py_object, py_object]
        _pydll = (tensor_hook, node_hook)
    return _pydll


@dataclass(frozen=True)
class HookState:
    """What the gradient hooks met in the open step: `marks` gradients counted; `twice` and `early` the
    first gradient hooked a second time, or before `arm` (else None); `error` the reducer's first failure
    under a hook (else None)."""
    marks: int
    twice: Optional[int]
    early: Optional[int]
    error: Optional[str]


class Reducer(NativeObject[ReducerHandle]):
    """A reducer of gradients of `shapes` (each as (rows, cols), a matrix as PowerSGD sees it) over the
    group of `comm` (a ferry_comm handle, kept alive by the reducer). `options`: ferry.h's
    ferry_reducer_create options."""

    _what = "Reducer"

    def __init__(self, comm: Any, shapes: Sequence[Tuple[int, int]], options: Dict[str, Any]) -> None:
        n = len(shapes)
        rows, cols = (c_int64 * n)(), (c_int64 * n)()
        for i, (r, c) in enumerate(shapes):
            rows[i], cols[i] = r, c
        handle = ReducerHandle()
        lib.ferry_reducer_create(comm, rows, cols, n, json.dumps(options).encode(), byref(handle))
        super().__init__(handle)
        self.count = n

    def _destroy(self, handle: ReducerHandle) -> None:
        lib.ferry_reducer_destroy(handle)

    # ---- layout ----------------------------------------------------------------------------------------
    def layout(self) -> Tuple[int, bool]:
        """(the layout's generation, whether the next begin_step lays the gradients out anew)."""
        generation, pending = c_uint64(), c_int()
        lib.ferry_reducer_layout(self.handle, byref(generation), byref(pending))
        return generation.value, bool(pending.value)

    def flat(self, from_dlpack: Callable[[Any], T]) -> T:
        """The flat gradient buffer as the framework's tensor, made by `from_dlpack` from a DLPack capsule
        (borrowed memory: valid until the layout changes or the reducer is closed)."""
        managed = c_void_p()
        lib.ferry_reducer_flat_dlpack(self.handle, byref(managed))
        try:
            return from_dlpack(make_capsule(managed.value))
        except BaseException:
            lib.ferry_dlpack_delete(managed)
            raise

    def places(self) -> List[Tuple[int, int]]:
        """Each gradient's (offset, elements) in the flat buffer, in elements of the gradients' type."""
        offset, count = c_size_t(), c_size_t()
        out = []
        for i in range(self.count):
            lib.ferry_reducer_place(self.handle, i, byref(offset), byref(count))
            out.append((offset.value, count.value))
        return out

    # ---- the step --------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        lib.ferry_reducer_begin_step(self.handle)

    def hooks(self, node: bool = False) -> List[Callable[..., None]]:
        """One callable per gradient, for the framework to call when that gradient is complete: with one
        argument (a post-accumulate-grad hook), or with `node`, two (a hook on the gradient's
        accumulation node). Valid while the reducer is open: remove them before close()."""
        tensor_hook, node_hook = _hook_functions()
        fn = node_hook if node else tensor_hook
        address = self.handle.value
        return [functools.partial(fn, address, i) for i in range(self.count)]

    def hook(self, i: int) -> None:
        """Gradient i is complete, told as its hook tells it (for a gradient that got none: see
        DataParallel's unused parameters)."""
        self._check_usable("hook")
        _hook_functions()[0](self._handle.value, i, None)

    def arm(self, stream: int) -> None:
        """The step's backward started; its gradients are produced on `stream`."""
        lib.ferry_reducer_hooks_arm(self.handle, stream)

    def hook_state(self) -> HookState:
        marks, twice, early, error = c_size_t(), c_int64(), c_int64(), c_void_p()
        lib.ferry_reducer_hooks_state(self.handle, byref(marks), byref(twice), byref(early), byref(error))
        return HookState(marks.value, None if twice.value < 0 else twice.value,
                         None if early.value < 0 else early.value,
                         take_string(error) if error.value else None)

    def hook_flags(self, unsynced: bool = False) -> Tuple[List[bool], Optional[List[bool]]]:
        """(which gradients were hooked in this step, and with `unsynced` which were hooked outside a step
        since the last such call: that call clears them)."""
        marked = (c_uint8 * self.count)()
        outside = (c_uint8 * self.count)() if unsynced else None
        lib.ferry_reducer_hooks_flags(self.handle, marked, outside, self.count)
        return [bool(m) for m in marked], None if outside is None else [bool(m) for m in outside]

    def finish(self, stream: int) -> None:
        """Closes the step: `stream` waits for the last bucket."""
        lib.ferry_reducer_finish(self.handle, stream)

    # ---- state -----------------------------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        out = c_void_p()
        lib.ferry_reducer_stats_json(self.handle, byref(out))
        return json.loads(take_string(out))
