"""Where an Egress delivers: the C++ sinks (null, checksum, raw file, .npy) and a Python callable."""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple, Union

from ._native import library, sinks as _native
from ._native.dlpack import BOOL, BFLOAT, COMPLEX, FLOAT, INT, UINT, TensorInfo, numpy_dtype


class ChunkInfo(NamedTuple):
    """Which part of which output a callback sink is given: the whole output when count == 1."""
    tag: int
    sequence: int     # submission number of the output, from 0
    offset: int       # byte offset of this chunk in the output
    total_bytes: int  # size of the whole output
    index: int        # chunk index, from 0
    count: int        # chunks of the output


class Sink:
    """Base of the sinks. A sink serves one Egress at a time."""

    def __init__(self) -> None:
        self._native: Optional[_native.Sink] = None  # made here, or at the first output (NpySink)
        self._owner: Optional["weakref.ReferenceType[Any]"] = None

    def _accept(self, info: TensorInfo, shape: Sequence[int]) -> None:
        """Raises ValueError when this sink cannot write a tensor like `info`."""

    @property
    def _ready(self) -> bool:
        return self._native is not None

    def _native_sink(self) -> _native.Sink:
        if self._native is None:
            raise RuntimeError(f"{type(self).__name__} is not ready: it learns its shape from the first output")
        return self._native

    def _attach(self, owner: Any) -> None:
        if self._owner is not None and self._owner() is not None and self._owner() is not owner:
            raise ValueError(f"{type(self).__name__} already serves another Egress; make one sink per Egress")
        self._owner = weakref.ref(owner)


class NullSink(Sink):
    """Discards every output (measures the pipeline alone)."""

    def __init__(self) -> None:
        super().__init__()
        self._native = _native.null_sink()


class ChecksumSink(Sink):
    """ferry's 64-bit checksum of every output, whatever its chunking: compare `checksum(tag)` with
    `ChecksumSink.of(array_or_bytes)` of the expected data."""

    def __init__(self) -> None:
        super().__init__()
        self._checksums = _native.ChecksumSink()
        self._native = self._checksums

    def checksum(self, tag: int) -> int:
        """The checksum of the output submitted with `tag` (after flush(), or once it was consumed)."""
        return self._checksums.checksum(tag)

    @property
    def completed(self) -> int:
        """Outputs whose every chunk was consumed."""
        return self._checksums.completed()

    @staticmethod
    def of(data: Union[bytes, bytearray, memoryview, Any]) -> int:
        """The checksum of `data` (bytes, or anything with the buffer protocol, such as a C-contiguous
        numpy array or a CPU tensor's .numpy()) taken as one whole output."""
        return library.checksum_of(data)


class RawFileSink(Sink):
    """Writes each output to `directory/<prefix><tag>.bin` (the directory must exist)."""

    def __init__(self, directory: Union[str, "os.PathLike[str]"], prefix: str = "output_") -> None:
        super().__init__()
        self.directory = os.fspath(directory)
        self.prefix = prefix
        if not os.path.isdir(self.directory):
            raise ValueError(f"RawFileSink: {self.directory!r} is not a directory")
        self._native = _native.raw_file_sink(self.directory, prefix)

    def path_of(self, tag: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}{tag}.bin")


_NPY_KIND = {INT: "i", UINT: "u", FLOAT: "f", COMPLEX: "c", BOOL: "b"}


def npy_descr(info: TensorInfo) -> Optional[str]:
    """The .npy dtype descriptor of a tensor's dtype, or None where numpy has none (bfloat16)."""
    if info.lanes != 1 or info.code not in _NPY_KIND:
        return None
    size = info.bits // 8
    if size == 1:
        return "|" + _NPY_KIND[info.code] + "1"
    if info.code == BOOL:
        return None
    return "<" + _NPY_KIND[info.code] + str(size)


def _dtype_text(info: TensorInfo) -> str:
    names = {INT: "int", UINT: "uint", FLOAT: "float", BFLOAT: "bfloat", COMPLEX: "complex", BOOL: "bool"}
    return f"{names.get(info.code, f'code {info.code}')}{info.bits}" + (f"x{info.lanes}" if info.lanes != 1 else "")


class NpySink(Sink):
    """Writes each output to `directory/<prefix><tag>.npy`, which numpy.load reads. Every output must have
    the same shape and dtype: given here, or taken from the first output when left None."""

    def __init__(self, directory: Union[str, "os.PathLike[str]"], shape: Optional[Sequence[int]] = None,
                 dtype: Optional[str] = None, prefix: str = "output_") -> None:
        super().__init__()
        self.directory = os.fspath(directory)
        self.prefix = prefix
        self.shape: Optional[Tuple[int, ...]] = tuple(int(d) for d in shape) if shape is not None else None
        self.dtype: Optional[str] = dtype
        if not os.path.isdir(self.directory):
            raise ValueError(f"NpySink: {self.directory!r} is not a directory")
        if self.shape is not None and self.dtype is not None:
            self._make()

    def _make(self) -> None:
        assert self.shape is not None and self.dtype is not None
        self._native = _native.npy_sink(self.directory, self.shape, self.dtype, self.prefix)

    def _accept(self, info: TensorInfo, shape: Sequence[int]) -> None:
        descr = npy_descr(info)
        if descr is None:
            raise ValueError(f"NpySink cannot write a tensor of dtype {_dtype_text(info)}: numpy has no such "
                             "dtype; convert it (for example .float()) or use RawFileSink")
        if self.dtype is not None and self.dtype != descr:
            raise ValueError(f"NpySink writes dtype {self.dtype!r}; this tensor is {descr!r} ({_dtype_text(info)})")
        if self.shape is not None and tuple(shape) != self.shape:
            raise ValueError(f"NpySink writes shape {self.shape}; this tensor has shape {tuple(shape)}")
        if self._native is None:
            self.shape, self.dtype = tuple(shape), descr
            self._make()

    def path_of(self, tag: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}{tag}.npy")


class CallbackSink(Sink):
    """Calls `fn(view, chunk)` for every output: `view` is a read-only numpy array over ferry's pinned
    slot (zero copy), shaped and typed like the output when it came in one chunk, else a flat array of the
    chunk (its dtype where the chunk holds whole elements, else uint8); `chunk` is a ChunkInfo. The view
    is valid only during the call: copy what you keep. Runs on a ferry worker thread with the GIL held for
    the call alone, one call at a time per worker. An exception fails the Egress and is raised in the
    caller at its next submit, flush or close."""

    def __init__(self, fn: Callable[[Any, ChunkInfo], Any]) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"CallbackSink: {fn!r} is not callable")
        self.fn = fn
        # By the output's sequence number, not its tag: a callback may be given one tag many times.
        self._meta: Dict[int, Tuple[Tuple[int, ...], Any]] = {}
        self._delivered: Dict[int, int] = {}
        self._lock = threading.Lock()
        # The Egress functions raise the callable's own exception for FERRY_ERROR_CALLBACK (ferry._c).
        self._callbacks = _native.CallbackSink(self._deliver)
        self._native = self._callbacks

    @property
    def error(self) -> Optional[BaseException]:
        """The first exception `fn` raised, or None."""
        return self._callbacks.error

    def _expect(self, sequence: int, shape: Sequence[int], info: TensorInfo) -> None:
        with self._lock:
            self._meta[sequence] = (tuple(shape), numpy_dtype(info.code, info.bits, info.lanes))
            self._delivered[sequence] = 0

    def _deliver(self, c: _native.Chunk) -> None:
        import numpy as np
        with self._lock:
            shape, dtype = self._meta.get(c.sequence, ((), None))
        if dtype is not None and c.offset % dtype.itemsize == 0 and c.data.nbytes % dtype.itemsize == 0:
            arr = np.frombuffer(c.data, dtype=dtype)
            if c.count == 1:
                arr = arr.reshape(shape)
        else:
            arr = np.frombuffer(c.data, dtype=np.uint8)
        self.fn(arr, ChunkInfo(c.tag, c.sequence, c.offset, c.total_bytes, c.index, c.count))
        with self._lock:
            self._delivered[c.sequence] = self._delivered.get(c.sequence, 0) + 1
            if self._delivered[c.sequence] == c.count:
                self._meta.pop(c.sequence, None)
                self._delivered.pop(c.sequence, None)


def as_sink(obj: Union[Sink, Callable[[Any, ChunkInfo], Any], None]) -> Sink:
    """A Sink as is; a callable becomes a CallbackSink; None a NullSink."""
    if obj is None:
        return NullSink()
    if isinstance(obj, Sink):
        return obj
    if callable(obj):
        return CallbackSink(obj)
    raise TypeError(f"Egress sink {obj!r}: expected a ferry sink (NullSink, ChecksumSink, RawFileSink, "
                    "NpySink, CallbackSink) or a callable")
