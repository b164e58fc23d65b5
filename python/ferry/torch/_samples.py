"""torch's SampleFormat for the Loader's framework-neutral core (ferry/_loader/): a sample of tensors,
numpy arrays and numbers (in tuples, lists, dicts or namedtuples) flattened into leaves, checked against
the first sample's layout and written into its slot; torch's generators seeded and its worker info set.
"""
from __future__ import annotations

import contextlib
import random
import warnings
from typing import Any, Iterator, List, Sequence, Tuple

from .._loader.layout import Layout, Spec
from .._loader.worker import SampleFormat
from .._native.loader import copy_strided
from .._template import Slot


def leaves_of(obj: Any, path: str, out: List[Tuple[str, Any]]) -> Any:
    """A template of a batch of such samples (tensors, numpy arrays and numbers in tuples, lists, dicts
    and namedtuples) with each leaf replaced by its index in `out`; the leaves as tensors. The batch's
    structure is default_collate's: a tuple becomes a list; lists, dicts and namedtuples keep their type."""
    import numpy as np
    import torch
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
    elif isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError(f"{path} is a numpy array of Python objects; a slot holds numbers")
        out.append((path, _array_tensor(obj)))
    elif isinstance(obj, np.generic):
        out.append((path, torch.from_numpy(np.asarray(obj).reshape(()).copy())))
    elif isinstance(obj, bool):
        out.append((path, torch.tensor(obj, dtype=torch.bool)))
    elif isinstance(obj, int):
        out.append((path, torch.tensor(obj, dtype=torch.int64)))
    elif isinstance(obj, float):
        out.append((path, torch.tensor(obj, dtype=torch.float64)))
    elif isinstance(obj, dict):
        return type(obj)((k, leaves_of(v, f"{path}[{k!r}]", out)) for k, v in obj.items())
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(leaves_of(v, f"{path}.{f}", out) for f, v in zip(obj._fields, obj)))
    elif isinstance(obj, tuple):
        # A list, as default_collate makes of a tuple (code that assigns into the batch relies on it).
        return [leaves_of(v, f"{path}[{i}]", out) for i, v in enumerate(obj)]
    elif isinstance(obj, list):
        return type(obj)(leaves_of(v, f"{path}[{i}]", out) for i, v in enumerate(obj))
    else:
        raise TypeError(f"{path} is a {type(obj).__name__}; a Loader sample holds tensors, numpy arrays and "
                        "numbers (in tuples, lists, dicts or namedtuples): turn it into one in the dataset or "
                        "transform")
    return Slot(len(out) - 1)


def _array_tensor(a: Any) -> Any:
    """A tensor over an array's memory, strided or read-only, without copying it (the Loader only reads
    it); an array with negative strides (a flipped view) is copied once, as torch cannot view it."""
    import numpy as np
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only: ferry only reads it
        try:
            return torch.from_numpy(a)
        except ValueError:
            return torch.from_numpy(np.ascontiguousarray(a))


def _shape_text(dtype: Any, shape: Sequence[int]) -> str:
    return f"{str(dtype).replace('torch.', '')}[{', '.join(map(str, shape))}]"


def _set_torch_worker_info(wid: int, workers: int, seed: int, dataset: Any) -> None:
    """Makes torch.utils.data.get_worker_info() answer in this worker, as in a DataLoader's: datasets
    shard or open their files by it. It reads torch.utils.data._utils.worker._worker_info, a WorkerInfo
    made from keywords (torch 1.13: frozen after __init__; 2.x: a frozen dataclass whose other fields
    have defaults). A torch whose WorkerInfo takes other arguments leaves it None."""
    try:
        from torch.utils.data._utils import worker as torch_worker
        info = torch_worker.WorkerInfo(id=wid, num_workers=workers, seed=seed, dataset=dataset)
    except (ImportError, AttributeError, TypeError):
        return
    torch_worker._worker_info = info


class TorchSamples(SampleFormat):
    """Samples as ferry.torch.Loader documents them."""

    def set_up_worker(self, wid: int, workers: int, seed: int, dataset: Any) -> None:
        import torch
        torch.set_num_threads(1)
        _set_torch_worker_info(wid, workers, seed, dataset)

    def seed(self, seed: int) -> None:
        import numpy as np
        import torch
        random.seed(seed)
        np.random.seed(seed & 0xFFFFFFFF)
        # The CPU generator only: torch.manual_seed also queues a CUDA seeding, with a formatted stack
        # (torch 1.13), in a process that never initializes CUDA: slow per sample.
        torch.default_generator.manual_seed(seed)

    @contextlib.contextmanager
    def random_state_kept(self) -> Iterator[None]:
        """The main process's random, numpy and torch CPU generator states, as they were, after the block: a
        Loader(workers=0) seeds them per sample as a worker does, without changing the program's streams."""
        import numpy as np
        import torch
        states = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.default_generator.set_state(states[2])

    def spec(self, sample: Any) -> Tuple[Any, List[Spec]]:
        flat: List[Tuple[str, Any]] = []
        template = leaves_of(sample, "sample", flat)
        return template, [Spec(p, t.dtype, tuple(t.shape), t.element_size()) for p, t in flat]

    def write(self, sample: Any, index: int, position: int, slot: int, layout: Layout) -> int:
        """Writes one sample's leaves into their places in the slot at address `slot`: the one copy of its
        bytes, gathered from any strides (a channels-first view of an image's channels-last bytes is a
        vectorized deinterleave: ferry_copy_strided)."""
        import torch
        flat: List[Tuple[str, Any]] = []
        leaves_of(sample, "sample", flat)
        leaves = layout.leaves
        if len(flat) != len(leaves):
            raise ValueError(f"sample {index} has {len(flat)} tensors ({', '.join(p for p, _ in flat)}); the first "
                             f"sample had {len(leaves)} ({', '.join(leaf.path for leaf in leaves)}): every sample "
                             "of a Loader has the same structure")
        written = 0
        for f, ((path, t), leaf) in enumerate(zip(flat, leaves)):
            if t.dtype != leaf.dtype or tuple(t.shape) != leaf.shape:
                raise ValueError(
                    f"sample {index}: {path} is {_shape_text(t.dtype, t.shape)}; the first sample's was "
                    f"{_shape_text(leaf.dtype, leaf.shape)}. A Loader batch holds samples of one shape and dtype: "
                    "resize, crop or pad them to one shape in the dataset or transform (variable-size samples: a "
                    "DataLoader with a collate_fn that pads, and ferry.torch.Prefetcher(batch_bytes=the largest))")
            if leaf.nbytes == 0:
                continue
            src = t.detach()
            if src.device.type != "cpu" or src.layout != torch.strided or src.is_quantized:
                raise ValueError(f"sample {index}: {path} is a {src.device.type} tensor of layout {src.layout}"
                                 f"{' (quantized)' if src.is_quantized else ''}; a Loader worker writes dense CPU "
                                 "tensors: return CPU tensors or arrays from the dataset")
            if src.is_conj() or src.is_neg():  # lazy conjugate or negation: the stored bytes are not the values
                src = src.resolve_conj().resolve_neg()
            item = src.element_size()
            copy_strided(slot + layout.place(f, position), src.data_ptr(), src.shape,
                         [s * item for s in src.stride()], item)
            written += leaf.nbytes
        return written
