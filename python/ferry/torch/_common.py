"""What ferry.torch's Egress and Prefetcher share: choosing the device, reading tensors through DLPack,
and turning the stream-likes users pass into native handles."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from .._device import Device, Stream, default_device
from .._native.dlpack import KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, TensorInfo, read_capsule

if TYPE_CHECKING:
    import torch

# What the `device` arguments accept (see resolve_device).
DeviceLike = Union[Device, "torch.device", str, int, None]
# What the `stream` arguments accept: a torch.cuda.Stream, an object with __cuda_stream__, a ferry.Stream,
# a cudaStream_t as int, or None (see stream_handle).
StreamLike = Any


def resolve_device(device: DeviceLike) -> Device:
    """None: the current CUDA device when torch sees a GPU, else ferry's host device. Also accepts a
    ferry.Device, a torch.device or its text ("cuda:1", "cpu"), an int (a CUDA ordinal), or "host"."""
    import torch
    if isinstance(device, Device):
        return device
    if device is None:
        if torch.cuda.is_available():
            return default_device("cuda", torch.cuda.current_device())
        return default_device("host")
    if isinstance(device, str) and device == "host":
        return default_device("host")
    if isinstance(device, int) and not isinstance(device, bool):
        return default_device("cuda", device)
    try:
        d = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"device {device!r}: expected a ferry.Device, a torch.device, 'cuda:N', 'cpu' "
                         "or 'host'") from e
    if d.type == "cpu":
        return default_device("host")
    if d.type == "cuda":
        return default_device("cuda", d.index if d.index is not None else torch.cuda.current_device())
    raise ValueError(f"device {device!r}: ferry drives CUDA devices (or its host emulation for 'cpu')")


def _stream_device_index(stream: Any) -> Optional[int]:
    d = getattr(stream, "device", None)
    if d is None:
        return None
    if getattr(d, "type", "cuda") != "cuda":
        return -1
    for attr in ("index", "device_id"):
        v = getattr(d, attr, None)
        if isinstance(v, int):
            return v
    return None


def stream_handle(dev: Device, stream: StreamLike) -> int:
    """The native handle of `stream` for ferry calls on `dev`. None is torch's current stream of the
    device (on the host backend: the device's default ferry stream)."""
    if isinstance(stream, Stream):
        same = stream.device is dev or (dev.backend == "cuda" and stream.device.backend == "cuda"
                                        and stream.device.ordinal == dev.ordinal)
        if not same:
            raise ValueError(f"{stream!r} belongs to {stream.device!r}, not to {dev!r}")
        return stream.handle
    if dev.backend == "host":
        if stream is None:
            return dev.default_stream().handle
        if isinstance(stream, int) and not isinstance(stream, bool):
            return stream  # the library accepts only the host device's live streams
        raise ValueError(f"stream {stream!r}: on ferry's host backend (no GPU) streams are ferry.Stream objects "
                         "of the device, or None")
    if stream is None:
        import torch
        return int(torch.cuda.current_stream(dev.ordinal).cuda_stream)
    if isinstance(stream, bool):
        raise TypeError(f"stream {stream!r}: expected a stream, its handle or None")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream handle {stream}: a cudaStream_t is >= 0")
        return stream
    index = _stream_device_index(stream)
    if index is not None and index != dev.ordinal:
        where = "the CPU" if index == -1 else f"cuda:{index}"
        raise ValueError(f"stream {stream!r} is on {where}; this object works on cuda:{dev.ordinal}")
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    raise TypeError(f"stream {stream!r}: expected a torch.cuda.Stream, an object with __cuda_stream__, "
                    "a ferry.Stream, a cudaStream_t as int, or None")


def dlpack_stream(dev: Device, handle: int) -> Optional[int]:
    """The `stream` argument of __dlpack__ that makes `handle` safe to read the tensor on (DLPack names
    the legacy default stream 1; CPU tensors take None)."""
    if dev.backend == "host":
        return None
    return 1 if handle == 0 else handle


def tensor_info(obj: Any, stream_arg: Optional[int]) -> TensorInfo:
    """Reads a tensor (anything with __dlpack__) through DLPack; the capsule is dropped unconsumed, so the
    caller keeps `obj` alive for as long as it uses the memory."""
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"{type(obj).__name__} is not a tensor: ferry takes objects with __dlpack__ "
                        "(torch.Tensor, numpy arrays on the host backend, CuPy, JAX)")
    # As torch.from_dlpack does: a stream only for device memory (CPU producers refuse one).
    if stream_arg is not None and hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] != KDL_CUDA:
        stream_arg = None
    capsule = obj.__dlpack__() if stream_arg is None else obj.__dlpack__(stream=stream_arg)
    return read_capsule(capsule)


def check_on_device(info: TensorInfo, dev: Device, what: str) -> None:
    if dev.backend == "cuda":
        if info.device_type != KDL_CUDA or info.device_id != dev.ordinal:
            raise ValueError(f"{what} is on {info.device_name}; it must be on cuda:{dev.ordinal}, the device "
                             "this object works on")
    elif info.device_type not in (KDL_CPU, KDL_CUDA_HOST):
        raise ValueError(f"{what} is on {info.device_name}; ferry's host backend (no GPU) takes CPU tensors")


def shape_text(info: TensorInfo) -> str:
    return f"shape {list(info.shape)}" + (f", strides {list(info.strides)}" if info.strides else "")


