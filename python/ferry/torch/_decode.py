"""ferry.torch.ImageDecode: a Loader option for datasets that return encoded JPEG images. The worker
reads each image's header and draws its crop; then either the worker decodes only the crop region on the
CPU (libjpeg-turbo, DCT-scaled) straight into the batch slot ("cpu"), or it writes the compressed bytes
into the slot and the batch is decoded on the GPU with nvJPEG ("device"). Both give the same crop boxes
(drawn from the sample's seed by ferry's generator, src/image/), the same output batch (size x size,
normalised, the caller's dtype and memory format) in the caller's stream order.

This file holds the option and the per-sample step the worker runs; the slot layout of the pixels or
the bytes is the Loader's (ferry/torch/_samples.py), the native calls are ferry/_native/image.py's.
"""
from __future__ import annotations

import functools
import math
from typing import Any, List, Optional, Sequence, Tuple, Union

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_CROPS = ("random", "center", "full")
_WHERE = ("auto", "device", "cpu")


def _pair(name: str, v: Any, low: float, high: float) -> Tuple[float, float]:
    if not (isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)):
        raise ValueError(f"ImageDecode({name}={v!r}): expected a pair of numbers")
    a, b = float(v[0]), float(v[1])
    if not (low < a <= b <= high) or not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"ImageDecode({name}={v!r}): expected {low} < low <= high <= {high}")
    return a, b


def _triple(name: str, v: Any, positive: bool) -> Optional[Tuple[float, float, float]]:
    if v is None:
        return None
    if not (isinstance(v, (tuple, list)) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)):
        raise ValueError(f"ImageDecode({name}={v!r}): expected three numbers (R, G, B) or None")
    t = (float(v[0]), float(v[1]), float(v[2]))
    if positive and not all(x > 0 and math.isfinite(x) for x in t):
        raise ValueError(f"ImageDecode({name}={v!r}): expected three positive numbers")
    return t


class ImageDecode:
    """Decodes a dataset's JPEG images in a ferry.torch.Loader, then random-resized-crops (or center-crops),
    flips and normalises each to `size` x `size`:

        loader = ferry.torch.Loader(dataset, batch_size=256, workers=4, shuffle=True,
                                    decode=ferry.torch.ImageDecode(224, dtype=torch.bfloat16,
                                                                   channels_last=True))
        for images, labels in loader:   # images: [256, 3, 224, 224] bfloat16 CUDA, normalised
            ...

    The dataset returns the encoded image (bytes, bytearray, memoryview, a 1-D uint8 numpy array or CPU
    tensor: a file's contents) at `image` of its sample: an index of a tuple or list sample (default 0,
    `(jpeg_bytes, label)`), a key of a dict sample, or None when the sample is the image alone. The
    batch has the sample's structure with that leaf replaced by the images.

    crop: "random" (torchvision's RandomResizedCrop: `scale`, `ratio`), "center" (the centered square of
    `crop_fraction` of the shorter side: Resize(256) + CenterCrop(224) at the default 0.875) or "full"
    (the whole image squeezed to the square). flip (default: True for "random"): a left-right mirror with
    probability 0.5. Each sample's crop and flip are drawn from its seed (the Loader's sample_seed), so a
    batch does not depend on the worker count, `where`, or timing.

    mean, std: the output is (pixel / 255 - mean) / std per channel (ImageNet's by default) in `dtype`
    (torch.float32 by default; bfloat16 and float16 too); mean=None and std=None give the uint8 pixels.
    channels_last: the batch in torch.channels_last memory format (its shape stays N, C, H, W).

    where: "device" decodes on the GPU with nvJPEG (its hardware engines for the images they take, its
    one-by-one decode for the others: progressive, grayscale): the workers only read the header, draw the
    box and copy the compressed bytes into the slot, and nvJPEG reads them there from the main process
    (its host part, ~15 ms a batch of 256 on an H200, runs in next()). "cpu" decodes in the workers with
    libjpeg-turbo, only the crop region and at the coarsest DCT scale that keeps the crop at least `size`
    pixels (0.45 to 0.61 of the CPU seconds of PIL's decode-then-crop, docs/PERFORMANCE.md). "auto" (the
    default) is "device" on a CUDA device where nvJPEG loads, else "cpu" (saying why once on a CUDA
    device). A sample that is not a JPEG ferry decodes (not a JPEG, CMYK/YCCK, lossless, arithmetic-coded,
    12-bit) is refused by index, naming what it is.
    """

    def __init__(self, size: int = 224, *, crop: str = "random", scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), crop_fraction: float = 0.875, flip: Optional[bool] = None,
                 mean: Optional[Sequence[float]] = IMAGENET_MEAN, std: Optional[Sequence[float]] = IMAGENET_STD,
                 dtype: Any = None, channels_last: bool = False, where: str = "auto",
                 image: Union[int, str, None] = 0, capacity: Optional[int] = None) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 8192:
            raise ValueError(f"ImageDecode(size={size!r}): expected an integer from 1 to 8192 (pixels per side)")
        if crop not in _CROPS:
            raise ValueError(f"ImageDecode(crop={crop!r}): expected one of {', '.join(map(repr, _CROPS))}")
        if where not in _WHERE:
            raise ValueError(f"ImageDecode(where={where!r}): expected one of {', '.join(map(repr, _WHERE))}")
        if not (isinstance(crop_fraction, (int, float)) and 0 < crop_fraction <= 1):
            raise ValueError(f"ImageDecode(crop_fraction={crop_fraction!r}): expected a number in (0, 1]")
        if (mean is None) != (std is None):
            raise ValueError(f"ImageDecode(mean={mean!r}, std={std!r}): give both or neither (neither: uint8 pixels)")
        if image is not None and not isinstance(image, (int, str)) or isinstance(image, bool):
            raise ValueError(f"ImageDecode(image={image!r}): expected an index, a dict key or None")
        if capacity is not None and (not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1024):
            raise ValueError(f"ImageDecode(capacity={capacity!r}): expected None or bytes a sample >= 1024")
        import torch
        if dtype is None:
            dtype = torch.float32 if mean is not None else torch.uint8
        floats = (torch.float32, torch.bfloat16, torch.float16)
        if mean is None and dtype != torch.uint8:
            raise ValueError(f"ImageDecode(dtype={dtype}, mean=None): without normalisation the batch is uint8")
        if mean is not None and dtype not in floats:
            raise ValueError(f"ImageDecode(dtype={dtype!r}): a normalised batch is float32, bfloat16 or float16")
        self.size, self.crop, self.where, self.image = size, crop, where, image
        self.scale = _pair("scale", scale, 0.0, 1.0)
        self.ratio = _pair("ratio", ratio, 0.0, math.inf)
        self.crop_fraction = float(crop_fraction)
        self.flip = (crop == "random") if flip is None else bool(flip)
        self.mean, self.std = _triple("mean", mean, False), _triple("std", std, True)
        self.dtype, self.channels_last = dtype, bool(channels_last)
        self.capacity = capacity

    def __repr__(self) -> str:
        return (f"ImageDecode({self.size}, crop={self.crop!r}, flip={self.flip}, where={self.where!r}, "
                f"dtype={self.dtype}, channels_last={self.channels_last})")

    # The device decode against the CPU one (reference()), in 8-bit levels: (largest mean, largest 99th
    # percentile) of the absolute difference over an image. The CPU decode scales in the DCT domain (1/2,
    # 1/4, 1/8) where the crop is large; nvJPEG decodes the whole image, then both resample the same box
    # with Pillow's BILINEAR arithmetic (tests/python/test_image.py states the CPU decode's own tolerance
    # against PIL: mean <= 2, p99 <= 8).
    tolerance = (2.5, 12.0)

    @property
    def path(self) -> str:
        """The Loader's name of the image leaf (ferry/torch/_samples.py's leaves_of)."""
        return "sample" if self.image is None else f"sample[{self.image!r}]"

    def box(self, encoded: Any, seed: int) -> Tuple[int, int, int, int, int]:
        """The crop of `encoded` (a JPEG's bytes) for a sample of seed `seed` (ferry.torch.sample_seed(seed,
        epoch, index) in a Loader): (top, left, height, width, flip) in the image's pixels."""
        from .._native import image
        info = image.jpeg_info(encoded)
        if info.refusal is not None:
            raise ValueError(f"the image is not a JPEG ferry decodes: {info.refusal}")
        mode = {"random": "random_resized", "center": "center", "full": "full"}[self.crop]
        b = image.crop_boxes([info.height], [info.width], [seed & 0xFFFFFFFFFFFFFFFF], mode, scale=self.scale,
                             ratio=self.ratio, flip_probability=0.5 if self.flip else 0.0,
                             crop_fraction=self.crop_fraction)[0]
        return int(b[0]), int(b[1]), int(b[2]), int(b[3]), int(b[4])

    def reference(self, encoded: Any, seed: int) -> Any:
        """The sample's image as the CPU decode makes it (uint8 [3, size, size], before normalisation): what
        a Loader with where="cpu" puts in the batch, and what the device decode is checked against."""
        import torch
        from .._native import image
        return torch.from_numpy(image.decode_crop(encoded, self.box(encoded, seed), self.size, "chw"))


class Pixels:
    """A sample's image in a worker, to be decoded by the write into its place in the slot (where="cpu")."""
    __slots__ = ("data", "box")

    def __init__(self, data: Any, box: Tuple[int, ...]) -> None:
        self.data, self.box = data, box


class Encoded:
    """A sample's image in a worker, its bytes to be copied into the slot with its box (where="device")."""
    __slots__ = ("data", "box")

    def __init__(self, data: Any, box: Tuple[int, ...]) -> None:
        self.data, self.box = data, box


def _encoded_bytes(v: Any, where: str) -> Any:
    """The JPEG's bytes as a buffer the native calls read in place."""
    import numpy as np
    if isinstance(v, (bytes, bytearray, memoryview)):
        return v
    if isinstance(v, np.ndarray) and v.dtype == np.uint8 and v.ndim == 1:
        return v
    try:
        import torch
        if isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1 and v.device.type == "cpu":
            return v.contiguous().numpy()
    except ImportError:
        pass
    what = type(v).__name__
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        what += f" of {str(v.dtype).replace('torch.', '')} {list(v.shape)}"
    raise TypeError(f"{where} is a {what}; ImageDecode expects the encoded image there (bytes, bytearray, "
                    "memoryview, a 1-D uint8 array or CPU tensor): return the file's contents, not decoded pixels")


def prepare(decode: ImageDecode, sample: Any, seed: int) -> Any:
    """In a worker, after the dataset and the transform: the sample with its image replaced by what the
    write puts in the slot (Pixels or Encoded), its crop drawn from the sample's seed."""
    key = decode.image
    if key is None:
        data = _encoded_bytes(sample, "the sample")
    else:
        try:
            data = _encoded_bytes(sample[key], f"sample[{key!r}]")
        except (IndexError, KeyError, TypeError) as e:
            if isinstance(e, TypeError) and "ImageDecode" in str(e):
                raise
            raise TypeError(f"ImageDecode(image={key!r}): the sample ({type(sample).__name__}) has no [{key!r}]; "
                            "`image` names where the encoded image is in a sample") from None
    wrapped = (Pixels if decode.where == "cpu" else Encoded)(data, decode.box(data, seed))
    if key is None:
        return wrapped
    if isinstance(sample, dict):
        out = dict(sample)
        out[key] = wrapped
        return type(sample)(out) if type(sample) is not dict else out
    items = list(sample)
    items[key] = wrapped  # type: ignore[index]
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):
        return type(sample)(*items)
    return tuple(items) if isinstance(sample, tuple) else type(sample)(items)


# ---- the main process -------------------------------------------------------------------------------

def resolved_decode(decode: Optional[ImageDecode], device: Any) -> Optional[ImageDecode]:
    """A copy of `decode` whose `where` is "cpu" or "device": "auto" chooses before the workers start
    (they write pixels or bytes), from the Loader's `device` argument as resolve_device() will read it
    and whether nvJPEG loads; choosing "cpu" on a CUDA device says why, once."""
    if decode is None:
        return None
    import copy
    out = copy.copy(decode)
    if decode.where != "auto":
        return out
    import torch
    if getattr(device, "backend", None) is not None:  # a ferry.Device (public or native)
        cuda = device.backend == "cuda"
    elif device is None:
        cuda = torch.cuda.is_available()
    elif isinstance(device, int) and not isinstance(device, bool):
        cuda = True
    else:
        cuda = str(device).startswith("cuda")
    out.where = "cpu"
    if cuda:
        from .._native import image_gpu
        info = image_gpu.library_info()
        if info.get("available"):
            out.where = "device"
        else:
            import warnings
            warnings.warn(f"ferry.torch.ImageDecode(where='auto') decodes on the CPU: nvJPEG is not available "
                          f"({info.get('error')})", RuntimeWarning, stacklevel=3)
    return out


def decoder_for(decode: ImageDecode, device: Any) -> Any:
    """The nvJPEG decoder of a where="device" decode on the Loader's device (None for "cpu"); a clear
    error where that cannot be."""
    if decode.where != "device":
        return None
    if device.backend != "cuda":
        raise ValueError(f"ImageDecode(where='device') decodes on a CUDA device; this Loader's device is "
                         f"{device!r}: use where='cpu' (or 'auto')")
    from .._native.image_gpu import JpegDecoder
    # One host thread: the split over several (threads > 1) failed on an H200 (docs/perf/2026-12-02/h200-image).
    return JpegDecoder(device._native, threads=1)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


@functools.lru_cache(maxsize=8)
def _levels(mean: Tuple[float, ...], std: Tuple[float, ...], device: Any) -> Tuple[Any, Any]:
    """mean and std in 8-bit levels, [1, 3, 1, 1] float32 on `device`: made once, not a copy to the device
    per batch."""
    import torch
    return (torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255,
            torch.tensor(std, device=device).view(1, 3, 1, 1) * 255)


def finish_images(decode: ImageDecode, decoder: Any, engine: Any, b: Any, values: List[Any], stream: int) -> None:
    """Batch b's images as the Loader hands them out, in `values` at the image leaf's place: the CPU
    decode's uint8 pixels normalised on the device (torch's ops, on the current stream), or the device
    decode of the bytes in the host slot (nvJPEG, one kernel on `stream`; the slot is held until nvJPEG
    has read it)."""
    import numpy as np
    import torch

    from .._native.loader import host_array
    lay = engine.layout
    f = next(i for i, leaf in enumerate(lay.leaves) if leaf.path == decode.path)
    n = len(b.items)
    size = decode.size
    if decode.where == "cpu":
        x = values[f]
        if decode.channels_last:
            x = x.permute(0, 3, 1, 2)  # [n, 3, size, size] over HWC bytes: a channels_last tensor
        if decode.mean is not None:
            m, s = _levels(decode.mean, decode.std, x.device)
            x = x.to(torch.float32).sub_(m).div_(s)
            if decode.dtype != torch.float32:
                x = x.to(decode.dtype)
        values[f] = x
        return
    addr = engine.slot_address(b.k)
    starts = host_array(addr + lay.starts[f], np.int64, n)
    lengths = host_array(addr + lay.lengths[f], np.int64, n)
    boxes = host_array(addr + lay.offsets[f + 1], np.int32, 5 * n).reshape(n, 5)
    pointers = (addr + lay.offsets[f] + starts).astype(np.uint64)
    fmt = torch.channels_last if decode.channels_last else torch.contiguous_format
    out = torch.empty((n, 3, size, size), dtype=decode.dtype, device=torch.device("cuda", decoder.device.ordinal),
                      memory_format=fmt)
    from .._native.image_gpu import SAMPLE_STATUSES
    codes, done = decoder.decode_at(pointers, lengths.astype(np.uint64), boxes.copy(), size=size,
                                    out=out.data_ptr(), stream=stream, dtype=_dtype_name(decode.dtype),
                                    layout="nhwc" if decode.channels_last else "nchw", mean=decode.mean,
                                    std=decode.std, statuses=True)
    engine.hold(b.k, done.synchronize)
    bad = [j for j in range(n) if codes[j] != 0]
    if bad:  # the worker read a decodable header; nvJPEG failed on the data after it
        j = bad[0]
        raise ValueError(f"sample {b.items[j][1]}: nvJPEG could not decode its JPEG ({SAMPLE_STATUSES[codes[j]]}; "
                         f"{len(bad)} of the batch's {n} samples failed)")
    values[f] = out
    values[f + 1] = None  # the boxes: no place in the batch

