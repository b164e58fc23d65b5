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

import math
from typing import Any, Optional, Sequence, Tuple, Union

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

    where: "device" decodes on the GPU with nvJPEG (its hardware engines where the GPU has them, the CUDA
    decoder otherwise): the workers only read the header and copy the compressed bytes into the slot, a
    few MB per batch cross PCIe instead of the pixels, and the CPU is free. "cpu" decodes in the workers
    with libjpeg-turbo, only the crop region and at the coarsest DCT scale that keeps the output sharp
    (about 3x fewer CPU seconds than PIL's decode-then-crop). "auto" (the default) is "device" on a CUDA
    device where nvJPEG loads, else "cpu" (and says why once). Progressive, grayscale and CMYK JPEGs are
    decoded on either path; a sample that is not a JPEG is refused by index, naming what it is.
    """

    def __init__(self, size: int = 224, *, crop: str = "random", scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), crop_fraction: float = 0.875, flip: Optional[bool] = None,
                 mean: Optional[Sequence[float]] = IMAGENET_MEAN, std: Optional[Sequence[float]] = IMAGENET_STD,
                 dtype: Any = None, channels_last: bool = False, where: str = "auto",
                 image: Union[int, str, None] = 0) -> None:
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

    def __repr__(self) -> str:
        return (f"ImageDecode({self.size}, crop={self.crop!r}, flip={self.flip}, where={self.where!r}, "
                f"dtype={self.dtype}, channels_last={self.channels_last})")
