"""The image calls of the library (ferry::image): the JPEG header parse, the crop boxes and the CPU decode
(libjpeg-turbo, opened by the library at run time). Arrays in and out are numpy arrays; the bytes of a
sample are anything with the buffer protocol (bytes, bytearray, memoryview, a uint8 numpy array).

The boxes are int32[5] {top, left, height, width, flip} in the image's pixels; their generator and draw order
are include/ferry/image/crop_box.hpp's (Note [Crop box generator]).
"""
from __future__ import annotations

from ctypes import POINTER, c_double, c_int32, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .._c import lib

__all__ = ["JpegInfo", "jpeg_info", "crop_boxes", "decode_crop", "decode_crop_batch", "MODES", "LAYOUTS",
           "PROCESSES", "STATUSES"]

# The codes of ferry.h's ferry_jpeg_info and ferry_image_boxes, by name.
STATUSES = ("ok", "not_jpeg", "truncated", "bad_marker", "bad_frame", "zero_size", "no_frame")
PROCESSES = ("baseline", "extended", "progressive", "lossless", "arithmetic", "hierarchical")
MODES = {"random_resized": 0, "center": 1, "full": 2}
LAYOUTS = {"chw": 0, "hwc": 1}
_INFO_FIELDS = 9


@dataclass(frozen=True)
class JpegInfo:
    """A JPEG's header as its markers say (no decode). `refusal` says why ferry's decoders refuse it (None
    when they take it); `offset` is where the parser stopped (the frame marker when ok)."""
    status: str
    height: int
    width: int
    components: int
    process: str
    precision: int
    adobe_transform: int
    decodable: bool
    offset: int
    refusal: Optional[str]

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def progressive(self) -> bool:
        return self.process == "progressive"


def _bytes(data: Any) -> np.ndarray:
    """A uint8 view of `data` (no copy) whose .ctypes.data is the first byte."""
    a = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if a.dtype != np.uint8 or not a.flags.c_contiguous:
        raise ValueError(f"the bytes of a JPEG must be contiguous uint8, not {a.dtype} "
                         f"{'contiguous' if a.flags.c_contiguous else 'strided'}")
    return a


def _ptr(a: np.ndarray, t: Any) -> Any:
    return a.ctypes.data_as(POINTER(t))


def jpeg_info(data: Any) -> JpegInfo:
    """The header of the JPEG in `data`, read from its markers; never raises for the content."""
    a = _bytes(data)
    out = (c_int32 * _INFO_FIELDS)()
    lib.ferry_jpeg_info(c_void_p(a.ctypes.data), a.size, out)
    refusal = lib.ferry_jpeg_refusal(c_void_p(a.ctypes.data), a.size)
    return JpegInfo(status=STATUSES[out[0]], height=out[1], width=out[2], components=out[3],
                    process=PROCESSES[out[4]], precision=out[5], adobe_transform=out[6], decodable=bool(out[7]),
                    offset=out[8], refusal=None if refusal is None else refusal.decode())


def crop_boxes(heights: Sequence[int], widths: Sequence[int], seeds: Sequence[int], mode: str = "random_resized",
               scale: Tuple[float, float] = (0.08, 1.0), ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
               flip_probability: float = 0.5, crop_fraction: float = 224.0 / 256.0) -> np.ndarray:
    """The crop boxes (int32 [n, 5]: top, left, height, width, flip) of images of heights[i] x widths[i]
    drawn from seeds[i] (unsigned 64-bit): mode "random_resized" (torchvision RandomResizedCrop(scale,
    ratio) and a flip with flip_probability), "center" (the largest centered square times crop_fraction)
    or "full"."""
    if mode not in MODES:
        raise ValueError(f"crop mode {mode!r} is none of {sorted(MODES)}")
    h = np.ascontiguousarray(heights, dtype=np.int32).reshape(-1)
    w = np.ascontiguousarray(widths, dtype=np.int32).reshape(-1)
    s = np.ascontiguousarray(np.asarray(seeds, dtype=np.uint64)).reshape(-1)
    if not h.size == w.size == s.size:
        raise ValueError(f"{h.size} heights, {w.size} widths and {s.size} seeds must be as many")
    params = (c_double * 6)(scale[0], scale[1], ratio[0], ratio[1], flip_probability, crop_fraction)
    out = np.empty((h.size, 5), dtype=np.int32)
    lib.ferry_image_boxes(h.size, _ptr(h, c_int32), _ptr(w, c_int32), _ptr(s, c_uint64), MODES[mode], params,
                          _ptr(out, c_int32))
    return out


def _output(n: Optional[int], size: int, layout: str, out: Optional[np.ndarray]) -> Tuple[np.ndarray, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is neither 'chw' nor 'hwc'")
    shape = (3, size, size) if layout == "chw" else (size, size, 3)
    if n is not None:
        shape = (n,) + shape
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    elif out.dtype != np.uint8 or not out.flags.c_contiguous or out.shape != shape:
        raise ValueError(f"out must be a contiguous uint8 array of shape {shape}, not {out.dtype} {out.shape}")
    return out, LAYOUTS[layout]


def decode_crop(data: Any, box: Sequence[int], size: int, layout: str = "chw",
                out: Optional[np.ndarray] = None) -> np.ndarray:
    """Decodes the JPEG in `data` (on this thread, the GIL released), crops `box` (top, left, height, width,
    flip), resizes it to size x size (PIL's BILINEAR) and flips it when box[4] is 1: uint8 [3, size, size]
    (layout "chw") or [size, size, 3] ("hwc"), into `out` when given."""
    a = _bytes(data)
    b = np.ascontiguousarray(box, dtype=np.int32).reshape(-1)
    if b.size != 5:
        raise ValueError(f"a crop box has 5 integers (top, left, height, width, flip), not {b.size}")
    out, code = _output(None, size, layout, out)
    lib.ferry_jpeg_decode_crop(c_void_p(a.ctypes.data), a.size, _ptr(b, c_int32), size, code,
                               c_void_p(out.ctypes.data), out.nbytes)
    return out


def decode_crop_batch(samples: Sequence[Any], boxes: Any, size: int, layout: str = "chw", threads: int = 1,
                      out: Optional[np.ndarray] = None) -> np.ndarray:
    """decode_crop of every sample on `threads` threads of the library (0: one per core): uint8
    [n, 3, size, size] or [n, size, size, 3]. A failure names the first failing sample by index."""
    arrays = [_bytes(s) for s in samples]
    n = len(arrays)
    b = np.ascontiguousarray(boxes, dtype=np.int32).reshape(-1)
    if b.size != 5 * n:
        raise ValueError(f"{n} samples need {n} boxes of 5 integers, not {b.size} integers")
    out, code = _output(n, size, layout, out)
    ptrs = (c_void_p * max(n, 1))(*[a.ctypes.data for a in arrays])
    sizes = (c_size_t * max(n, 1))(*[a.size for a in arrays])
    stride = out.nbytes // n if n else 0
    lib.ferry_jpeg_decode_crop_batch(n, ptrs, sizes, _ptr(b, c_int32), size, code, c_void_p(out.ctypes.data),
                                     stride, threads)
    return out
