"""torch's SampleFormat for the Loader's framework-neutral core (ferry/_loader/): a sample of tensors,
numpy arrays, numbers and byte strings (in tuples, lists, dicts or namedtuples) flattened into leaves,
checked against the first sample's layout and written into its slot; torch's generators seeded and its
worker info set.

The write of a chunk (_Writer) has two paths. The general one flattens each sample (leaves_of), checks
every leaf against the layout and copies it (ferry_copy_strided: any strides); it also writes the
variable leaves (padded, ragged: ferry/_loader/layout.py) and raises every refusal. For layouts of
fixed leaves of at most FAST_BYTES a sample, a fast path takes over after the first sample it wrote: a
function generated for that sample's structure (its containers' exact types, lengths and keys) takes a
sample's leaves and checks their types, dtypes and shapes, and the chunk's leaves are written at its
end, one call per leaf (torch.stack into the slot's view of the leaf, struct.pack_into for numbers).
Anything it does not recognise, or a write that fails, goes through the general path, which raises the
same errors naming the same sample as it always did.

Seeding: torch's CPU generator is seeded before every sample. random's and numpy's global generators
are seeded lazily (_LazySeeds): a worker seeds each before its first sample and looks whether the sample
drew from it; one that was not drawn from is not seeded again while samples leave it alone (its draws
would be the same), and a sample that does draw from it is made again with every generator seeded,
after which that generator is seeded before every sample. Skipped seeds cost the same bytes and save
about 6 us a sample (random.seed takes 4).
"""
from __future__ import annotations

import contextlib
import functools
import random
import struct
import time
import warnings
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

from .._loader.layout import ALIGN, FIXED, PADDED, RAGGED, CapacityError, Layout, Spec
from .._loader.worker import AtSample, SampleFormat, Writer
from .._native.loader import copy_bytes, copy_strided, fill_bytes, numpy_fingerprint, random_fingerprint
from .._template import Slot
from ._decode import Encoded, ImageDecode, Pixels
from ._decode import prepare as _prepare_image

FAST_BYTES = 64 * 1024  # a sample of at most this many bytes (fixed leaves) is written by the fast path
BYTES = (bytes, bytearray, memoryview)  # leaves that are ragged by themselves
BOX = "#box"  # the suffix of the path of an Encoded image's crop box (a leaf of no template slot)


def leaves_of(obj: Any, path: str, out: List[Tuple[str, Any]]) -> Any:
    """A template of a batch of such samples (tensors, numpy arrays, numbers and byte strings in tuples,
    lists, dicts and namedtuples) with each leaf replaced by its index in `out`; the leaves as tensors
    (byte strings as they are). The batch's structure is default_collate's: a tuple becomes a list;
    lists, dicts and namedtuples keep their type."""
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
    elif isinstance(obj, BYTES):
        out.append((path, obj))
    elif isinstance(obj, Pixels):  # ImageDecode(where="cpu"): decoded by the write, into the slot
        out.append((path, obj))
    elif isinstance(obj, Encoded):  # ImageDecode(where="device"): its bytes (ragged) and its crop box
        out.append((path, _byte_view(obj.data)))
        out.append((path + BOX, torch.tensor(obj.box, dtype=torch.int32)))
        return Slot(len(out) - 2)
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
        raise TypeError(f"{path} is a {type(obj).__name__}; a Loader sample holds tensors, numpy arrays, "
                        "numbers and byte strings (in tuples, lists, dicts or namedtuples): turn it into one in "
                        "the dataset or transform")
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


def _byte_view(v: Any) -> memoryview:
    """A flat unsigned-byte view of a bytes-like object (a copy of a non-contiguous memoryview)."""
    m = memoryview(v)
    if not m.c_contiguous:
        m = memoryview(m.tobytes())
    return m.cast("B") if (m.format != "B" or m.ndim != 1) else m


def _shape_text(dtype: Any, shape: Sequence[int]) -> str:
    return f"{str(dtype).replace('torch.', '')}[{', '.join(map(str, shape))}]"


def _what(t: Any) -> str:
    return f"bytes[{memoryview(t).nbytes}] ({type(t).__name__})" if isinstance(t, BYTES) else \
        _shape_text(t.dtype, t.shape)


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


# ---- lazy seeding ----------------------------------------------------------------------------------------

class _LazySeeds:
    """random's and numpy's seeding in a worker (see the module): per generator, "probe" (seeded; the
    next sample shows whether it draws), "lazy" (not drawn since it was seeded: not seeded again) or
    "eager" (drawn from: seeded before every sample). While every generator is lazy, one read of both
    fingerprints is all a sample costs."""

    def __init__(self) -> None:
        import numpy as np
        np_seed = np.random.seed
        self.gens: List[List[Any]] = []  # [seed function, fingerprint, state, fingerprint when seeded]
        for seed_fn, fp in ((random.seed, random_fingerprint()),
                            (lambda s: np_seed(s & 0xFFFFFFFF), numpy_fingerprint())):
            self.gens.append([seed_fn, fp, "probe" if fp is not None else "eager", None])
        self.all_lazy = False
        self.clean: Any = None  # while all_lazy: both fingerprints as they were seeded
        self._both: Optional[Callable[[], Any]] = None

    def before(self, seed: int) -> None:
        if self.all_lazy:
            return
        for g in self.gens:
            if g[2] != "lazy":
                g[0](seed)
                if g[2] == "probe":
                    g[3] = g[1]()

    def drawn_unseeded(self) -> bool:
        if self.all_lazy:
            both = self._both
            assert both is not None
            if both() == self.clean:
                return False
            self.all_lazy = False  # one was drawn from: which is found below
        redo = False
        for g in self.gens:
            state = g[2]
            if state == "eager":
                continue
            changed = g[1]() != g[3]
            if state == "probe":
                g[2] = "eager" if changed else "lazy"
            elif changed:  # drawn from while not seeded for this sample
                g[2] = "eager"
                redo = True
        if all(g[2] == "lazy" for g in self.gens):
            (_, a, _, sa), (_, b, _, sb) = self.gens
            self._both = lambda: (a(), b())
            self.clean = (sa, sb)
            self.all_lazy = True
        return redo

    def lazy_check(self) -> Optional[Callable[[], bool]]:
        """While every generator is lazy: drawn_unseeded() in one frame (None otherwise)."""
        if not self.all_lazy:
            return None
        (_, a, _, sa), (_, b, _, sb) = self.gens
        slow = self.drawn_unseeded

        def check() -> bool:
            if a() == sa and b() == sb:
                return False
            return slow()
        return check


# ---- the format --------------------------------------------------------------------------------------

class TorchSamples(SampleFormat):
    """Samples as ferry.torch.Loader documents them; `ragged` and `pad` name the leaves (paths) declared
    variable, `pad_value` fills a padded leaf's rows past its length; `decode` (an ImageDecode whose
    `where` is "cpu" or "device") replaces each sample's encoded image (ferry/torch/_decode.py)."""

    def __init__(self, ragged: Iterable[str] = (), pad: Iterable[str] = (), pad_value: Any = 0,
                 decode: Optional[ImageDecode] = None) -> None:
        self.ragged: FrozenSet[str] = frozenset(ragged)
        self.pad: FrozenSet[str] = frozenset(pad)
        self.pad_value = pad_value
        self.decode = decode
        if decode is not None:
            self.prepare = functools.partial(_prepare_image, decode)
        self._lazy: Optional[_LazySeeds] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {"ragged": self.ragged, "pad": self.pad, "pad_value": self.pad_value, "decode": self.decode}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["ragged"], state["pad"], state["pad_value"], state["decode"])  # type: ignore[misc]

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

    def seed_lazily(self, seed: int) -> None:
        lazy = self._lazy
        if lazy is None:
            import torch
            lazy = self._lazy = _LazySeeds()
            self._torch_seed = torch.default_generator.manual_seed
        self._torch_seed(seed)
        lazy.before(seed)

    def drawn_unseeded(self) -> bool:
        return self._lazy is not None and self._lazy.drawn_unseeded()

    def sample_hooks(self) -> Tuple[Callable[[int], None], Callable[[], bool]]:
        """seed_lazily and drawn_unseeded as the current states allow them cheapest: while random and
        numpy are both lazy, torch's own seeding and a one-frame check. Valid until drawn_unseeded()
        returns True (a generator became eager): fetched again then, and at each chunk."""
        lazy = self._lazy
        check = lazy.lazy_check() if lazy is not None else None
        if check is None:
            return self.seed_lazily, self.drawn_unseeded
        return self._torch_seed, check

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
        paths = [p for p, _ in flat]
        for name, declared in (("ragged", self.ragged), ("pad", self.pad)):
            unknown = sorted(declared - set(paths))
            if unknown:
                raise ValueError(f"Loader({name}=...) names {', '.join(unknown)}, which the first sample does not "
                                 f"have; its leaves: {', '.join(paths)}")
        both = sorted(self.ragged & self.pad)
        if both:
            raise ValueError(f"Loader: {', '.join(both)} is declared both ragged and pad; choose one")
        out = []
        for p, t in flat:
            if isinstance(t, Pixels):
                size = self.decode.size  # type: ignore[union-attr]
                shape = (size, size, 3) if self.decode.channels_last else (3, size, size)  # type: ignore[union-attr]
                out.append(Spec(p, _uint8(), shape, 1))
            elif isinstance(t, BYTES):
                if p in self.pad:
                    raise ValueError(f"Loader(pad=...): {p} is a {type(t).__name__}, whose samples are ragged "
                                     "by themselves (a byte slab with offsets and lengths): leave it out of pad")
                out.append(Spec(p, _uint8(), (memoryview(t).nbytes,), 1, RAGGED))
            elif p in self.ragged:
                if t.dim() != 1:
                    raise ValueError(f"Loader(ragged=...): {p} is {_what(t)}; a ragged leaf is one-dimensional "
                                     "(its elements' bytes): for a leading dimension that varies use pad=")
                out.append(Spec(p, t.dtype, tuple(t.shape), t.element_size(), RAGGED))
            elif p in self.pad:
                if t.dim() < 1:
                    raise ValueError(f"Loader(pad=...): {p} is a scalar ({_what(t)}); a padded leaf has a leading "
                                     "dimension")
                out.append(Spec(p, t.dtype, tuple(t.shape), t.element_size(), PADDED))
            else:
                out.append(Spec(p, t.dtype, tuple(t.shape), t.element_size()))
        return template, out

    def writer(self, layout: Layout, address: int, buffer: Any) -> Writer:
        return _Writer(self, layout, address, buffer)


def _uint8() -> Any:
    import torch
    return torch.uint8


# ---- the write of a chunk -------------------------------------------------------------------------------

class _Writer(Writer):
    """Writes a chunk's samples into a slot of the mapping at `address` (`buffer`: a writable buffer over
    the same memory); see the module."""

    def __init__(self, fmt: TorchSamples, layout: Layout, address: int, buffer: Any) -> None:
        self.fmt, self.layout, self.address = fmt, layout, address
        self.mv = memoryview(buffer).cast("B") if memoryview(buffer).format != "B" else memoryview(buffer)
        self.buffer = buffer
        self.seconds = 0.0
        self.written = 0
        self._fast: Optional[_Fast] = None
        self._fast_tried = False
        self._pending: List[Tuple[Any, int, int]] = []
        self._views: Dict[int, List[Any]] = {}  # slot offset -> the fast path's views of its leaves
        self._pads: Dict[int, Any] = {}  # padded leaf -> a capacity of rows of pad_value (nonzero values)
        self._cursor: List[int] = []
        self._end: List[int] = []
        self._region: List[int] = []
        self.slot_offset = 0
        self.first = self.count = 0
        small = sum(leaf.nbytes for leaf in layout.leaves) <= FAST_BYTES
        self._may_fast = small and not layout.variable and not any(_is_complex(leaf.dtype) for leaf in layout.leaves)

    def close(self) -> None:
        """Drops every view of the mapping (before it is unmapped)."""
        self._pending.clear()
        self._views.clear()
        self._fast = None
        self.__dict__.pop("add", None)  # the fast add() refers to this writer
        self.mv.release()

    def begin(self, slot_offset: int, first: int, count: int) -> None:
        self.slot_offset, self.first, self.count = slot_offset, first, count
        self.written = 0
        lay = self.layout
        self._group = -1  # the first position of the group of ragged samples being written

    def add(self, sample: Any, index: int, position: int) -> None:
        fast = self._fast
        if fast is not None:
            try:
                took = fast.take(sample)
            except Exception:  # noqa: BLE001 - a missing key, an odd object: the general path says what
                fast.drop_partial(len(self._pending))
                took = False
            if took:
                self._pending.append((sample, index, position))
                return
            self.flush()
        self._add_slow(sample, index, position)
        if not self._fast_tried and self._may_fast:
            self._fast_tried = True
            self._fast = fast = _Fast.build(sample, self.layout)
            if fast is not None:
                self.add = self._fast_add(fast)  # type: ignore[method-assign]

    def _add_slow(self, sample: Any, index: int, position: int) -> None:
        t0 = time.perf_counter()
        try:
            self.written += self._write_one(sample, index, position)
        finally:
            self.seconds += time.perf_counter() - t0

    def _fast_add(self, fast: "_Fast") -> Callable[[Any, int, int], None]:
        """add() once the fast path is built: the per-sample cost of cheap samples."""
        take, pending = fast.take, self._pending
        keep, flush, slow = pending.append, self.flush, self._add_slow

        def add(sample: Any, index: int, position: int) -> None:
            try:
                took = take(sample)
            except Exception:  # noqa: BLE001 - a missing key, an odd object: the general path says what
                fast.drop_partial(len(pending))
                took = False
            if took:
                keep((sample, index, position))
                return
            flush()
            slow(sample, index, position)
        return add

    def flush(self) -> None:
        """Writes the samples the fast path took (AtSample for one that fails, after the ones before it)."""
        pending = self._pending
        if not pending:
            return
        assert self._fast is not None
        t0 = time.perf_counter()
        try:
            if self._write_fast(pending):
                self.written += len(pending) * self._fast.sample_bytes
            else:  # written again one by one: the first that fails says why
                for sample, index, position in pending:
                    try:
                        self.written += self._write_one(sample, index, position)
                    except Exception as e:  # noqa: BLE001
                        raise AtSample(position, index, e) from None
        finally:
            self._fast.clear()
            pending.clear()
            self.seconds += time.perf_counter() - t0

    def finish(self) -> int:
        self.flush()
        return self.written

    def _write_fast(self, pending: List[Tuple[Any, int, int]]) -> bool:
        """The fast path's write of `pending`; False where it failed. Its exception is dropped here, so that
        no traceback (of a later error, as its context) holds the views of the slots."""
        assert self._fast is not None
        try:
            views = self._views.get(self.slot_offset)
            if views is None:
                views = self._views[self.slot_offset] = self._fast.views(self.buffer, self.slot_offset)
            self._fast.write(views, self.mv, self.slot_offset, pending[0][2], len(pending))
            return True
        except Exception:  # noqa: BLE001
            return False

    # ---- the general path ----

    def _write_one(self, sample: Any, index: int, position: int) -> int:
        """Writes one sample's leaves into their places in the slot: the one copy of its bytes, gathered from
        any strides (a channels-first view of an image's channels-last bytes is a vectorized deinterleave:
        ferry_copy_strided)."""
        import torch
        flat: List[Tuple[str, Any]] = []
        leaves_of(sample, "sample", flat)
        lay = self.layout
        leaves = lay.leaves
        if len(flat) != len(leaves):
            raise ValueError(f"sample {index} has {len(flat)} leaves ({', '.join(p for p, _ in flat)}); the first "
                             f"sample had {len(leaves)} ({', '.join(leaf.path for leaf in leaves)}): every sample "
                             "of a Loader has the same structure")
        slot = self.address + self.slot_offset
        written = 0
        for f, ((path, t), leaf) in enumerate(zip(flat, leaves)):
            if leaf.kind == RAGGED:
                written += self._write_ragged(f, path, t, leaf, index, position)
                continue
            if isinstance(t, Pixels):  # decoded straight into its place in the slot
                import numpy as np
                from .._native.image import decode_crop
                out = np.frombuffer(self.mv, np.uint8, leaf.nbytes, self.slot_offset + lay.place(f, position))
                try:  # no traceback keeps the view of the mapping (close() releases it)
                    decode_crop(t.data, t.box, leaf.shape[1], "hwc" if self.fmt.decode.channels_last else "chw",
                                out.reshape(leaf.shape))
                finally:
                    del out
                written += leaf.nbytes
                continue
            if isinstance(t, BYTES):
                raise ValueError(f"sample {index}: {path} is {_what(t)}; the first sample's was "
                                 f"{_shape_text(leaf.dtype, leaf.shape)}: every sample of a Loader has the same "
                                 "structure")
            if leaf.kind == PADDED:
                if t.dtype != leaf.dtype or t.dim() != len(leaf.shape) or tuple(t.shape[1:]) != leaf.shape[1:]:
                    raise ValueError(
                        f"sample {index}: {path} is {_shape_text(t.dtype, t.shape)}; the first sample's was "
                        f"{_shape_text(leaf.dtype, ('L', *leaf.shape[1:]))} (pad= lets its leading dimension vary, "
                        "not its dtype nor the others)")
                rows = t.shape[0]
                if rows > leaf.capacity:
                    grown = max(2 * leaf.capacity, rows)
                    raise CapacityError(
                        f"sample {index}: {path} has {rows} rows, over its capacity of {leaf.capacity} "
                        f"(Loader(pad=...): the most rows of a sample; pad={{{path!r}: {grown}}} admits it)",
                        path, "pad", grown)
            elif t.dtype != leaf.dtype or tuple(t.shape) != leaf.shape:
                raise ValueError(
                    f"sample {index}: {path} is {_shape_text(t.dtype, t.shape)}; the first sample's was "
                    f"{_shape_text(leaf.dtype, leaf.shape)}. A Loader batch holds samples of one shape and dtype: "
                    "resize, crop or pad them to one shape in the dataset or transform, or declare the leaf "
                    f"variable: Loader(pad=({path!r},)) pads a leading dimension that varies to the batch's "
                    f"longest (with the lengths), Loader(ragged=({path!r},)) keeps one-dimensional samples' bytes "
                    "(a slab with offsets and lengths)")
            dst = slot + lay.place(f, position)
            nbytes = self._copy_tensor(dst, path, t, index)
            written += nbytes
            if leaf.kind == PADDED:
                self._pad(f, leaf, dst + nbytes, leaf.nbytes - nbytes)
                struct.pack_into("<q", self.mv, self.slot_offset + lay.lengths[f] + 8 * position, t.shape[0])
        return written

    def _copy_tensor(self, dst: int, path: str, t: Any, index: int) -> int:
        import torch
        nbytes = t.numel() * t.element_size()
        if nbytes == 0:
            return 0
        src = t.detach()
        if src.device.type != "cpu" or src.layout != torch.strided or src.is_quantized:
            raise ValueError(f"sample {index}: {path} is a {src.device.type} tensor of layout {src.layout}"
                             f"{' (quantized)' if src.is_quantized else ''}; a Loader worker writes dense CPU "
                             "tensors: return CPU tensors or arrays from the dataset")
        if src.is_conj() or src.is_neg():  # lazy conjugate or negation: the stored bytes are not the values
            src = src.resolve_conj().resolve_neg()
        item = src.element_size()
        copy_strided(dst, src.data_ptr(), src.shape, [s * item for s in src.stride()], item)
        return nbytes

    def _pad(self, f: int, leaf: Any, dst: int, nbytes: int) -> None:
        """Fills a padded sample's rows past its length with the pad value."""
        if nbytes <= 0:
            return
        value = self.fmt.pad_value
        if value == 0:
            fill_bytes(dst, 0, nbytes)
            return
        pattern = self._pads.get(f)
        if pattern is None:
            import torch
            pattern = self._pads[f] = torch.full(leaf.shape, value, dtype=leaf.dtype)
        copy_bytes(dst, pattern.data_ptr() + leaf.nbytes - nbytes, nbytes)

    def _write_ragged(self, f: int, path: str, t: Any, leaf: Any, index: int, position: int) -> int:
        lay = self.layout
        if isinstance(t, BYTES):
            if leaf.itemsize != 1 or str(leaf.dtype) != "torch.uint8":
                raise ValueError(f"sample {index}: {path} is {_what(t)}; the first sample's was "
                                 f"{_shape_text(leaf.dtype, ('L',))}")
            view = _byte_view(t)
            nbytes = view.nbytes
        else:
            if t.dim() != 1 or t.dtype != leaf.dtype:
                first = "bytes" if str(leaf.dtype) == "torch.uint8" and leaf.itemsize == 1 else \
                    _shape_text(leaf.dtype, ("L",))
                if not (t.dim() == 1 and str(t.dtype) == "torch.uint8" and first == "bytes"):
                    raise ValueError(f"sample {index}: {path} is {_what(t)}; the first sample's was {first} "
                                     "(a ragged leaf: one-dimensional samples of one dtype)")
            view = None
            nbytes = t.numel() * t.element_size()
        group = position - position % lay.group
        if group != self._group:  # a new group: its room starts (ferry/_loader/layout.py)
            self._group = group
            self._region = [self.slot_offset + lay.place(g, group) for g in range(len(lay.leaves))]
            self._cursor = list(self._region)
            end = min(group + lay.group, lay.batch_size)
            self._end = [self.slot_offset + lay.place(g, end) for g in range(len(lay.leaves))]
        at = self._cursor[f]
        if at + nbytes > self._end[f]:
            used = at - self._region[f]
            size = min(lay.group, lay.batch_size - group)
            room = f"its group's {size} x {leaf.capacity}"
            where = (f"with the {position - group} samples before it in its group (positions {group}-{position}, "
                     f"{used} bytes) that is {used + nbytes} bytes, over {room}" if position > group else
                     f"over {room}")
            need = -(-(used + nbytes) // size)
            grown = max(2 * leaf.capacity, (need + ALIGN - 1) // ALIGN * ALIGN)
            raise CapacityError(
                f"sample {index}: {path} has {nbytes} bytes; {where} (Loader(ragged=...): capacity={leaf.capacity} "
                f"bytes a sample, on average over a group of {lay.group} samples of the batch; "
                f"ragged={{{path!r}: {grown}}} admits it)", path, "ragged", grown)
        if nbytes:
            if view is not None:
                self.mv[at:at + nbytes] = view
            else:
                self._copy_tensor(self.address + at, path, t, index)
        self._cursor[f] = at + nbytes
        base = self.slot_offset
        struct.pack_into("<q", self.mv, base + lay.starts[f] + 8 * position, at - base - lay.offsets[f])
        struct.pack_into("<q", self.mv, base + lay.lengths[f] + 8 * position, nbytes)
        return nbytes


def _is_complex(dtype: Any) -> bool:
    return getattr(dtype, "is_complex", False)


# ---- the fast path ---------------------------------------------------------------------------------------

class _Fast:
    """The fast path for samples of one structure (see the module): take(sample) checks a sample and keeps
    its leaves (False: not recognised, nothing kept), write() writes the kept ones of a run of positions."""

    def __init__(self, take: Callable[[Any], bool], fields: List[Tuple[str, Any, List[Any]]], layout: Layout) -> None:
        self.take = take
        self.fields = fields  # per leaf: (kind, its layout leaf, the values kept)
        self.layout = layout
        self.sample_bytes = sum(leaf.nbytes for leaf in layout.leaves)
        self._formats: Dict[Tuple[str, int], str] = {}

    @staticmethod
    def build(sample: Any, layout: Layout) -> Optional["_Fast"]:
        """The fast path for samples structured as `sample` (written by the general path: it fits the
        layout), or None for a structure it does not handle."""
        import numpy as np
        import torch
        lines: List[str] = []
        names: Dict[str, Any] = {"Tensor": torch.Tensor, "ndarray": np.ndarray}
        leaves: List[Tuple[str, str]] = []  # (expression, kind)

        def const(value: Any) -> str:
            name = f"c{len(names)}"
            names[name] = value
            return name

        def walk(obj: Any, expr: str, depth: int) -> bool:
            if depth > 8:
                return False
            t = type(obj)
            if isinstance(obj, torch.Tensor):
                leaves.append((expr, "tensor"))
            elif isinstance(obj, np.ndarray):
                leaves.append((expr, "array"))
            elif isinstance(obj, np.generic):
                leaves.append((expr, "generic:" + const(t)))
            elif t is bool:
                leaves.append((expr, "bool"))
            elif t is int:
                leaves.append((expr, "int"))
            elif t is float:
                leaves.append((expr, "float"))
            elif isinstance(obj, dict):
                lines.append(f"    if type({expr}) is not {const(t)} or len({expr}) != {len(obj)}: return False")
                return all(walk(v, f"{expr}[{const(k)}]", depth + 1) for k, v in obj.items())
            elif isinstance(obj, (tuple, list)):
                if hasattr(obj, "_fields"):
                    lines.append(f"    if type({expr}) is not {const(t)}: return False")
                else:
                    lines.append(f"    if type({expr}) is not {const(t)} or len({expr}) != {len(obj)}: return False")
                return all(walk(v, f"{expr}[{i}]", depth + 1) for i, v in enumerate(obj))
            else:
                return False
            return True

        if not walk(sample, "s", 0) or len(leaves) != len(layout.leaves):
            return None
        fields: List[Tuple[str, Any, List[Any]]] = []
        body = list(lines)
        appends = []
        for f, ((expr, kind), leaf) in enumerate(zip(leaves, layout.leaves)):
            v = f"v{f}"
            body.append(f"    {v} = {expr}")
            if kind == "tensor":
                body.append(f"    if not (isinstance({v}, Tensor) and {v}.dtype is {const(leaf.dtype)} and "
                            f"{v}.shape == {const(tuple(leaf.shape))}): return False")
            elif kind == "array":
                body.append(f"    if not (isinstance({v}, ndarray) and {v}.dtype == {const(np.dtype(_np_dtype(leaf.dtype)))}"
                            f" and {v}.shape == {const(tuple(leaf.shape))}): return False")
            elif kind.startswith("generic:"):
                body.append(f"    if type({v}) is not {kind.split(':', 1)[1]}: return False")
            else:
                body.append(f"    if type({v}) is not {kind}: return False")
            values: List[Any] = []
            fields.append((kind, leaf, values))
            appends.append(f"    {const(values.append)}({v})")
        source = "def take(s):\n" + "\n".join(body + appends) + "\n    return True\n"
        exec(compile(source, "<ferry loader fast path>", "exec"), names)  # noqa: S102 - our own code
        return _Fast(names["take"], fields, layout)

    def drop_partial(self, kept: int) -> None:
        """Drops the values a take() that raised part-way appended (none is appended before every check
        passed, but keep the lists in step whatever happened)."""
        for _, _, values in self.fields:
            del values[kept:]

    def clear(self) -> None:
        for _, _, values in self.fields:
            values.clear()

    def views(self, buffer: Any, slot_offset: int) -> List[Any]:
        """Per leaf, a tensor (or, for arrays and numpy scalars, an array) over its place in the slot."""
        import torch
        base = torch.frombuffer(buffer, dtype=torch.uint8)
        out: List[Any] = []
        lay = self.layout
        for f, (kind, leaf, _) in enumerate(self.fields):
            if leaf.nbytes == 0 or kind in ("int", "float", "bool"):
                out.append(None)
                continue
            start = slot_offset + lay.offsets[f]
            view = base[start:start + leaf.nbytes * lay.batch_size].view(leaf.dtype).view(lay.batch_size, *leaf.shape)
            out.append(view if kind == "tensor" else view.numpy())
        return out

    def write(self, views: List[Any], mv: memoryview, slot_offset: int, first: int, n: int) -> None:
        import torch
        lay = self.layout
        # Not torch.no_grad(): its context manager costs more than the stack (14 us in torch 1.13).
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            for f, (kind, leaf, values) in enumerate(self.fields):
                if leaf.nbytes == 0:
                    continue
                if kind == "tensor":
                    torch.stack(values, out=views[f][first:first + n])
                elif kind in ("int", "float", "bool"):
                    code = {"int": "q", "float": "d", "bool": "?"}[kind]
                    fmt = self._formats.get((code, n))
                    if fmt is None:
                        fmt = self._formats[(code, n)] = f"<{n}{code}"
                    struct.pack_into(fmt, mv, slot_offset + lay.offsets[f] + first * leaf.nbytes, *values)
                else:
                    view = views[f]
                    for j, v in enumerate(values):
                        view[first + j] = v
        finally:
            torch._C._set_grad_enabled(grad)


def _np_dtype(dtype: Any) -> Any:
    import torch
    return torch.empty((), dtype=dtype).numpy().dtype
