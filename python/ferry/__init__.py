"""ferry keeps GPUs fed and drained. This package is ferry's Python API over its C ABI (libferry_c.so,
loaded with ctypes): the same library serves any Python 3 and any torch.

    import ferry
    ferry.probe()                       # the host-device links, as `ferry probe`
    a = ferry.analyze("trace.json")     # a PyTorch profiler trace, as `ferry analyze`
    a.findings[0].rule; a.to_html("report.html")

    from ferry.torch import Egress, Prefetcher
"""
from __future__ import annotations

from ._analyze import Analysis, Finding, IdleAttribution, Link, ProbeResult, Step, analyze, probe
from ._c import (CallbackError, ClosedError, CudaError, FerryError, InputError, InvalidArgumentError,
                 OutOfMemoryError, lib as _lib, library_path)
from ._device import Device, Event, Stream, default_device
from ._runtime import ForkedError
from .sinks import CallbackSink, ChecksumSink, ChunkInfo, NpySink, NullSink, RawFileSink, Sink

__version__ = _lib.ferry_version().decode()

__all__ = ["__version__", "Device", "Stream", "Event", "default_device", "probe", "ProbeResult", "Link",
           "analyze", "Analysis", "Step", "Finding", "IdleAttribution", "Sink", "NullSink", "ChecksumSink",
           "RawFileSink", "NpySink", "CallbackSink", "ChunkInfo", "FerryError", "InvalidArgumentError",
           "CudaError", "OutOfMemoryError", "ClosedError", "InputError", "CallbackError", "ForkedError",
           "library_path"]
