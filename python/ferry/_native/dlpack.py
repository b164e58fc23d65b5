"""DLPack (unversioned, dlpack.h) read and made from Python with ctypes: the way tensors cross between
ferry and any framework without linking it."""
from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple, TypeVar

from .._c import lib

T = TypeVar("T")

if TYPE_CHECKING:
    import numpy

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm",
                13: "cuda_managed"}

# DLDataTypeCode
INT, UINT, FLOAT, BFLOAT, COMPLEX, BOOL = 0, 1, 2, 4, 5, 6


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p),
                            ("deleter", ctypes.CFUNCTYPE(None, POINTER(DLManagedTensor)))]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]


@dataclass(frozen=True)
class TensorInfo:
    """What ferry needs to know of a tensor: where its bytes are and how they are laid out."""
    data: int
    nbytes: int
    shape: Tuple[int, ...]
    device_type: int
    device_id: int
    code: int
    bits: int
    lanes: int
    contiguous: bool
    strides: Optional[Tuple[int, ...]]

    @property
    def device_name(self) -> str:
        name = DEVICE_NAMES.get(self.device_type, f"device type {self.device_type}")
        return f"{name}:{self.device_id}" if self.device_type in (KDL_CUDA, 10) else name

    @property
    def itemsize(self) -> int:
        return self.bits // 8 * self.lanes


def _c_contiguous(shape, strides) -> bool:
    if strides is None or 0 in shape:
        return True
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def read_capsule(capsule: Any) -> TensorInfo:
    """Reads an unconsumed "dltensor" capsule without consuming it (its producer still frees it)."""
    ptr = _get_pointer(capsule, b"dltensor")
    m = DLManagedTensor.from_address(ptr)
    t = m.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    n = 1
    for d in shape:
        n *= d
    itemsize = t.dtype.bits // 8 * t.dtype.lanes
    return TensorInfo(data=(t.data or 0) + t.byte_offset, nbytes=n * itemsize, shape=shape,
                      device_type=t.device.device_type, device_id=t.device.device_id, code=t.dtype.code,
                      bits=t.dtype.bits, lanes=t.dtype.lanes, contiguous=_c_contiguous(shape, strides),
                      strides=strides)


def make_capsule(managed: int) -> Any:
    """A "dltensor" capsule over a DLManagedTensor made by ferry. It has no destructor: the caller hands
    it to a consumer at once, and runs the deleter itself (ferry_dlpack_delete) if the consumer refuses."""
    return _new_capsule(managed, b"dltensor", None)


def hand_over(managed: int, convert: Callable[[Any], T]) -> T:
    """convert(capsule) over a DLManagedTensor that ferry made (ferry_batch_dlpack,
    ferry_reducer_flat_dlpack): the consumer (torch.utils.dlpack.from_dlpack, numpy.from_dlpack) takes it
    over; when it refuses, the tensor's deleter runs here (ferry_dlpack_delete) and its error goes on."""
    try:
        return convert(make_capsule(managed))
    except BaseException:
        lib.ferry_dlpack_delete(managed)
        raise


def numpy_dtype(code: int, bits: int, lanes: int) -> Optional["numpy.dtype[Any]"]:
    """The numpy dtype of a DLPack dtype, or None where numpy has none (bfloat16, vector lanes)."""
    import numpy as np
    if lanes != 1:
        return None
    kind = {INT: "i", UINT: "u", FLOAT: "f", COMPLEX: "c", BOOL: "b"}.get(code)
    if kind is None:
        return None
    if kind == "b":
        return np.dtype(np.bool_) if bits == 8 else None
    try:
        return np.dtype(f"{kind}{bits // 8}")
    except TypeError:
        return None
