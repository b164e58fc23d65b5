"""A stand-in tensor on any device, made through DLPack, for checks that need a device this machine lacks."""
import ctypes

from ferry._native import dlpack as _dlpack


class FakeTensor:
    """Has __dlpack__ only: a capsule describing `shape` float32 at a bogus address on `device_type`:`device_id`."""

    def __init__(self, shape, device_type, device_id=0, strides=None):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        self.m = _dlpack.DLManagedTensor()
        t = self.m.dl_tensor
        t.data = 0x1000
        t.device = _dlpack.DLDevice(device_type, device_id)
        t.ndim = len(shape)
        t.dtype = _dlpack.DLDataType(_dlpack.FLOAT, 32, 1)
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))

    def __dlpack__(self, stream=None):
        return _dlpack.make_capsule(ctypes.addressof(self.m))
