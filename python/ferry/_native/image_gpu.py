"""The GPU JPEG decoder of the library (ferry_jpeg_decoder: nvJPEG, opened by the library at run time, decodes
each batch; one kernel crops each sample's box, resizes it as PIL's BILINEAR does, flips it and writes the
normalised batch), and where nvJPEG is (no GPU needed to ask).

The output is a device address (an int) of n * 3 * size * size elements of `dtype`, dense in `layout`;
streams are native handles (ints), as everywhere in the native layer. The boxes are int32[5] {top, left,
height, width, flip} per sample, as ferry._native.image.crop_boxes makes them. Streams, events and buffer
reuse: Note [GPU decode: streams, events and buffers] in include/ferry/image/gpu_decoder.hpp.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import sys
from ctypes import POINTER, byref, c_float, c_int32, c_size_t, c_uint8, c_void_p
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._c import EventHandle, JpegDecoderHandle, lib
from ._base import NativeObject
from .device import Device, Event
from .library import out_json

__all__ = ["JpegDecoder", "library_info", "nvjpeg_dirs", "DTYPES", "LAYOUTS", "SAMPLE_STATUSES", "BACKENDS"]

# The codes of ferry.h's ferry_jpeg_decoder_decode, by name.
DTYPES = {"uint8": 0, "float32": 1, "bfloat16": 2, "float16": 3}
LAYOUTS = {"nchw": 0, "nhwc": 1}
SAMPLE_STATUSES = ("ok", "undecodable", "failed")
BACKENDS = ("auto", "hardware", "software")


def nvjpeg_dirs() -> List[str]:
    """The folders of this interpreter's package folders that hold a libnvjpeg: nvidia/*/lib (the
    nvidia-nvjpeg-cu13 and -cu12 wheels; nvidia/cu13/lib first), then torchvision.libs (the copy a torchvision
    wheel may bundle): where the library looks after the loader's own search. The library also finds them from
    the folders of libraries already loaded (torch's)."""
    found: List[str] = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        dirs = sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib")))
        dirs.sort(key=lambda d: os.path.basename(os.path.dirname(d)) != "cu13")
        dirs.append(os.path.join(entry, "torchvision.libs"))
        for d in dirs:
            has = glob.glob(os.path.join(d, "libnvjpeg.so*")) + glob.glob(os.path.join(d, "libnvjpeg-*.so*"))
            if has and d not in found:
                found.append(d)
    return found


def _options(**fields: Any) -> bytes:
    return json.dumps({k: v for k, v in fields.items() if v is not None}).encode()


def library_info(library_dirs: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """ferry_jpeg_gpu_library_json: {"available", "path", "version", "error" (why not, and what to install),
    "tried"}, looking in `library_dirs` (default: nvjpeg_dirs()) first."""
    dirs = list(nvjpeg_dirs() if library_dirs is None else library_dirs)
    return out_json(lib.ferry_jpeg_gpu_library_json, _options(library_dirs=dirs))


def _address(sample: Any) -> Tuple[int, int, Any]:
    """(address, length, keeper) of a sample's bytes: bytes, bytearray, memoryview or a uint8 numpy array,
    contiguous; `keeper` holds the memory while the decoder may read it."""
    a = sample if isinstance(sample, np.ndarray) else np.frombuffer(sample, dtype=np.uint8)
    if a.dtype != np.uint8 or not a.flags.c_contiguous:
        raise ValueError(f"a JPEG sample must be contiguous uint8 bytes, not {a.dtype} "
                         f"{'contiguous' if a.flags.c_contiguous else 'strided'}")
    if a.size == 0:
        raise ValueError("a JPEG sample has 0 bytes")
    return int(a.ctypes.data), int(a.size), a


def _code(table: Dict[str, int], name: str, what: str) -> int:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"JpegDecoder.decode: {what} {name!r} is not one of {', '.join(table)}") from None


class JpegDecoder(NativeObject[JpegDecoderHandle]):
    """ferry_jpeg_decoder on `device` (a cuda device). backend "auto" (the GPU's JPEG engines for the images
    they take, nvJPEG's one-by-one decode for the rest), "hardware" (fails without engines) or "software";
    `buffers` scratch sets used in turn; `threads` host threads each decode call's nvJPEG work is split over,
    the calling thread among them (1..64; None: the library's default, 1; more fails on an H200 with nvJPEG 13.0.1: not for use yet);
    `library_dirs` (default: nvjpeg_dirs()) looked in first for libnvjpeg. Raises InvalidArgumentError naming
    a bad option, or what to install when nvJPEG is missing."""

    def __init__(self, device: Device, *, backend: str = "auto", buffers: int = 2, threads: Optional[int] = None,
                 library_dirs: Optional[Sequence[str]] = None) -> None:
        dirs = list(nvjpeg_dirs() if library_dirs is None else library_dirs)
        h = JpegDecoderHandle()
        lib.ferry_jpeg_decoder_create(device.handle, _options(backend=backend, buffers=buffers, threads=threads,
                                                              library_dirs=dirs), byref(h))
        super().__init__(h)
        self.device = device  # outlives the decoder: destroyed after it
        # The samples of the last `buffers` calls that returned: the library may read a call's host bytes until
        # `buffers` later calls have returned (each waits for its scratch set's previous decode), and none of
        # a call that raised once it has raised.
        self._kept: Deque[Any] = collections.deque(maxlen=buffers)

    def _destroy(self, handle: JpegDecoderHandle) -> None:
        lib.ferry_jpeg_decoder_destroy(handle)
        self._kept.clear()

    def decode(self, samples: Sequence[Any], boxes: Any, *, size: int, out: int, stream: int,
               dtype: str = "uint8", layout: str = "nchw", mean: Optional[Sequence[float]] = None,
               std: Optional[Sequence[float]] = None, statuses: bool = False) -> Optional[np.ndarray]:
        """Decodes `samples` (each bytes-like) with boxes (n x 5 int32) into `out` on `stream`. The decoder keeps
        the samples referenced for as long as it may read them. With statuses=True returns each sample's code
        (SAMPLE_STATUSES) and writes the samples that are not ok as zeros; else the first such sample raises
        InputError naming it."""
        held = [_address(s) for s in samples]
        pointers = np.array([p for p, _, _ in held], dtype=np.uint64)
        lengths = np.array([n for _, n, _ in held], dtype=np.uint64)
        codes, _ = self._decode(pointers, lengths, boxes, size=size, out=out, stream=stream, dtype=dtype,
                                layout=layout, mean=mean, std=std, statuses=statuses, inputs_done=False)
        self._kept.append(held)  # after the call: evicts the call `buffers` back, no longer read
        return codes

    def decode_at(self, pointers: Any, lengths: Any, boxes: Any, *, size: int, out: int, stream: int,
                  dtype: str = "uint8", layout: str = "nchw", mean: Optional[Sequence[float]] = None,
                  std: Optional[Sequence[float]] = None,
                  statuses: bool = False) -> Tuple[Optional[np.ndarray], Event]:
        """decode() of samples the caller holds at host addresses `pointers` (lengths[i] bytes each; a pinned
        slab, say). Returns (statuses or None, the Event after which the library no longer reads them): keep
        the bytes unchanged until it completes (or until any event recorded on `stream` after this call)."""
        codes, done = self._decode(np.ascontiguousarray(pointers, dtype=np.uint64),
                                   np.ascontiguousarray(lengths, dtype=np.uint64), boxes, size=size, out=out,
                                   stream=stream, dtype=dtype, layout=layout, mean=mean, std=std,
                                   statuses=statuses, inputs_done=True)
        assert done is not None
        return codes, done

    def _decode(self, pointers: np.ndarray, lengths: np.ndarray, boxes: Any, *, size: int, out: int, stream: int,
                dtype: str, layout: str, mean: Optional[Sequence[float]], std: Optional[Sequence[float]],
                statuses: bool, inputs_done: bool) -> Tuple[Optional[np.ndarray], Optional[Event]]:
        n = int(pointers.size)
        if lengths.size != n:
            raise ValueError(f"JpegDecoder.decode: {n} samples but {lengths.size} lengths")
        b = np.ascontiguousarray(boxes, dtype=np.int32)
        if b.shape != (n, 5):
            raise ValueError(f"JpegDecoder.decode: boxes of shape {b.shape}; {n} samples need ({n}, 5)")
        dtype_code = _code(DTYPES, dtype, "dtype")
        layout_code = _code(LAYOUTS, layout, "layout")
        mean_c = (c_float * 3)(*mean) if mean is not None else None
        std_c = (c_float * 3)(*std) if std is not None else None
        codes = np.zeros(n, dtype=np.int32) if statuses else None
        ev = EventHandle() if inputs_done else None
        lib.ferry_jpeg_decoder_decode(
            self.handle, n, pointers.ctypes.data_as(POINTER(c_void_p)), lengths.ctypes.data_as(POINTER(c_size_t)),
            b.ctypes.data_as(POINTER(c_int32)), size, out, dtype_code, layout_code, mean_c, std_c, stream,
            codes.ctypes.data_as(POINTER(c_int32)) if codes is not None else None,
            byref(ev) if ev is not None else None)
        return codes, (Event(self.device, ev) if ev is not None else None)

    def image(self, index: int) -> np.ndarray:
        """For tests: sample `index` of the last decode as nvJPEG decoded it, whole: uint8 (channels, height,
        width), R, G, B planes (one luma plane for a grayscale JPEG; channels 0 when not decoded)."""
        h, w, c = c_int32(), c_int32(), c_int32()
        lib.ferry_jpeg_decoder_image(self.handle, index, None, 0, byref(h), byref(w), byref(c))
        img = np.empty((c.value, h.value, w.value), dtype=np.uint8)
        if img.size:
            lib.ferry_jpeg_decoder_image(self.handle, index, img.ctypes.data_as(POINTER(c_uint8)), img.size,
                                         byref(h), byref(w), byref(c))
        return img

    def stats(self) -> Dict[str, Any]:
        return out_json(lib.ferry_jpeg_decoder_stats_json, self.handle)
