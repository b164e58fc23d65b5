"""ferry keeps GPUs fed and drained. This package is ferry's Python API over its C ABI (libferry_c.so,
loaded with ctypes): the same library serves any Python 3 and any torch.

    import ferry
    ferry.probe()                       # the host-device links, as `ferry probe`
    a = ferry.analyze("trace.json")     # a PyTorch profiler trace, as `ferry analyze`
    a.findings[0].rule; a.to_html("report.html")

    from ferry.torch import Egress, Prefetcher

The distribution is `ferry-gpu` (`pip show ferry-gpu`); it installs this package and the `ferry` command
(also `python -m ferry`). `ferry.__version__` is the PEP 440 version of both; `ferry.library_version` is
the loaded library's, with the commit it was built from as a local label (what `ferry --version` prints).
"""
from __future__ import annotations

from ._analyze import (Analysis, Finding, IdleAttribution, Link, Neighbour, ProbeResult, Step, Uncovered,
                       analyze, probe)
from ._c import (CallbackError, ClosedError, CudaError, FerryError, InputError, InvalidArgumentError,
                 OutOfMemoryError)
from ._device import Device, Event, Stream, default_device
from ._runtime import ForkedError
from ._version import __version__
from ._native.library import library_path, version as _library_version
from .sinks import CallbackSink, ChecksumSink, ChunkInfo, NpySink, NullSink, RawFileSink, Sink

library_version: str = _library_version()

__all__ = ["__version__", "library_version", "Device", "Stream", "Event", "default_device", "probe",
           "ProbeResult", "Link", "analyze", "Analysis", "Step", "Finding", "IdleAttribution", "Uncovered",
           "Neighbour", "Sink", "NullSink", "ChecksumSink", "RawFileSink", "NpySink", "CallbackSink", "ChunkInfo",
           "FerryError", "InvalidArgumentError", "CudaError", "OutOfMemoryError", "ClosedError", "InputError",
           "CallbackError", "ForkedError", "library_path"]
