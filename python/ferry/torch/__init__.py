"""ferry for PyTorch: Egress (GPU tensors drained to a sink), Prefetcher (CPU batches prefetched to the
GPU) and DataParallel (gradients reduced between processes while backward runs). torch is imported here,
not by `import ferry`; tensors cross by DLPack, so any torch works."""
from __future__ import annotations

from .._device import Event
from ..sinks import CallbackSink, ChecksumSink, ChunkInfo, NpySink, NullSink, RawFileSink, Sink
from ._data_parallel import DataParallel
from ._egress import Egress
from ._prefetch import Prefetcher

__all__ = ["Egress", "Prefetcher", "DataParallel", "Event", "Sink", "NullSink", "ChecksumSink", "RawFileSink", "NpySink",
           "CallbackSink", "ChunkInfo"]
