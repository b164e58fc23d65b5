"""ferry for PyTorch: Egress (GPU tensors drained to a sink), Prefetcher (CPU batches prefetched to the
GPU), Loader (a Dataset's samples written by worker processes straight into pinned slots), DataParallel (gradients reduced between processes while backward runs) and comm_hook (ferry's
codecs inside torch's own DDP). torch is imported here,
not by `import ferry`; tensors cross by DLPack, so any torch works."""
from __future__ import annotations

from .._device import Event
from ..sinks import CallbackSink, ChecksumSink, ChunkInfo, NpySink, NullSink, RawFileSink, Sink
from ._comm_hook import comm_hook
from ._data_parallel import DataParallel
from ._decode import ImageDecode
from ._egress import Egress
from ._loader import Loader, Padded, RaggedBatch, WorkerInfo, sample_seed, worker_info
from ._prefetch import Prefetcher

__all__ = ["ImageDecode", "Egress", "Prefetcher", "Loader", "Padded", "RaggedBatch", "WorkerInfo", "worker_info", "sample_seed", "DataParallel", "comm_hook", "Event", "Sink", "NullSink", "ChecksumSink", "RawFileSink", "NpySink",
           "CallbackSink", "ChunkInfo"]
