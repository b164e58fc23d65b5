"""GPU JPEG decode (issue 39): ferry's nvJPEG decoder checked pixel by pixel against PIL, and timed beside
torchvision's batched decode_jpeg(device="cuda") + v2 resized_crop.

Run on a GPU machine through scripts/gpu_image.sh (it sets LD_LIBRARY_PATH to the nvidia packages' lib folders
and FERRY_LIBRARY to .carry/libferry_c.so), or directly:

    python3 scripts/gpu_image.py [--batch 256] [--images 1024] [--iters 20] [--json out.json]

What it checks (each a named check; the script exits 1 when one fails):
- library: where nvJPEG was found, its version, whether the decoder uses the hardware engines.
- kernel: for every decoded sample of every checked batch, ferry's uint8 output against PIL's
  crop + resize(BILINEAR) + flip of the image *as ferry's nvJPEG decoded it* (JpegDecoder.image): this isolates
  the crop/resize/flip kernel, which does Pillow's fixed-point arithmetic, so the tolerance is 0 levels
  (|diff| <= 1 is reported but counted as a failure too).
- end_to_end: ferry's uint8 output against PIL's own decode (libjpeg-turbo) + crop + resize + flip: nvJPEG's
  IDCT, chroma upsampling and colour conversion differ from libjpeg-turbo's, so the tolerance is a mean |diff|
  <= 2.0 levels per sample (max and 99.9th percentile reported).
- floats: float32, bfloat16, float16 outputs (NCHW and NHWC) equal (x / 255 - mean) / std of ferry's own uint8
  output computed with numpy float32 and rounded by torch: tolerance 0 (bit for bit).
- layouts: NHWC output == NCHW output permuted.
- kinds: progressive, grayscale, 4:4:4, 4:2:2, a small image (upscaled), a large one (2000 x 1500), odd sizes
  decode (statuses 0) and pass `kernel`; CMYK and a PNG are refused with status 1 (undecodable), a truncated file
  is reported as whatever nvJPEG makes of it.
- refusals: a bad size, a box outside its image and an unknown dtype raise naming the argument; with no status
  array a CMYK sample raises InputError naming its index.
- ordering: the output is written on the consumer stream after its queued work (a fill queued behind a 50 ms
  sleep on that stream comes before the decode's write, so the decode's values are what remain), also on the
  default stream (handle 0, bridged), and the same batch decodes to the same bytes twice.
- reuse: batches of 1, 7, 256, 3, 256 samples in a row (scratch grown and reused) with buffers 1 and 2; and
  with one scratch set behind a consumer stream 100 ms busy, two batches decoded back to back both come out
  right (the hardware engines write at the call, so the decoder must wait on the host for the set's kernel).
- bench_check: after the timed loop, every bench batch decoded again and 2 samples of each checked (kernel and
  end_to_end): the count of wrong batches (the goal is 0).
Every check above runs twice: with threads=SPLIT (4: a call's batch split over that many host
threads; the library's default is 1 until this passes on a GPU) and with threads=1 (the calling thread alone); the second's names end in
"@threads=1". The kinds batch holds every kind three times (33 samples) so that the default splits it.
--dry-run runs all of it on a CPU with PIL standing in for ferry's decoder (it checks the script, not ferry).
Timed (images/s, ms per batch, process CPU seconds per batch, the calling thread's CPU seconds per batch, and
the mean host latency of one decode() call): ferry uint8 NCHW, ferry bfloat16 NHWC normalised (what a
channels_last bf16 model eats) and ferry with backend "software", each with threads=1 and the default side by
side, torchvision decode_jpeg alone, and torchvision decode_jpeg + per-sample v2 resized_crop + flip +
normalise. JSON to --json, or $OUT/gpu_image.json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "examples" / "pytorch"))
import loader_jpeg  # noqa: E402  (its test images)

import torch  # noqa: E402

from ferry import _c  # noqa: E402
from ferry._native.device import Device  # noqa: E402
from ferry._native.image import crop_boxes  # noqa: E402
from ferry._native.image_gpu import JpegDecoder, library_info, nvjpeg_dirs  # noqa: E402

BILINEAR = getattr(Image, "Resampling", Image).BILINEAR
FLIP = getattr(Image, "Transpose", Image).FLIP_LEFT_RIGHT
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
END_TO_END_MEAN = 2.0  # levels: nvJPEG against libjpeg-turbo, per sample, after the resize
DEVICE = "cuda"  # where the output batches are allocated ("cpu" under --dry-run)


# ---- the JPEGs ---------------------------------------------------------------------------------------

SPLIT = 4  # the threads the split checks and rows use

def picture(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """examples/pytorch/loader_jpeg.py's image of a seed drawn from `rng`."""
    return loader_jpeg.picture(int(rng.integers(1 << 31)), w, h)


def encode(img: Image.Image, **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


def regular_jpegs(n: int, seed: int = 0) -> List[bytes]:
    """n JPEGs of 500x375 to 640x480, quality 90, 4:2:0 (PIL's default), as loader_jpeg.py makes them."""
    out = []
    for i in range(n):
        rng = np.random.default_rng(seed + i)
        w, h = int(rng.integers(500, 641)), int(rng.integers(375, 481))
        out.append(encode(Image.fromarray(picture(rng, w, h)), quality=90))
    return out


def special_jpegs() -> Dict[str, bytes]:
    """The kinds the decoder must handle or refuse by index."""
    rng = np.random.default_rng(1234)
    rgb = Image.fromarray(picture(rng, 600, 450))
    png = io.BytesIO()
    rgb.save(png, "PNG")
    whole = encode(rgb, quality=90)
    return {
        "baseline_420": whole,
        "progressive": encode(rgb, quality=90, progressive=True),
        "grayscale": encode(rgb.convert("L"), quality=90),
        "444": encode(rgb, quality=90, subsampling=0),
        "422": encode(rgb, quality=90, subsampling=1),
        "small_120x90": encode(Image.fromarray(picture(rng, 120, 90)), quality=90),
        "large_2000x1500": encode(Image.fromarray(picture(rng, 2000, 1500)), quality=90),
        "odd_333x257": encode(Image.fromarray(picture(rng, 333, 257)), quality=85),
        "cmyk": encode(rgb.convert("CMYK"), quality=90),
        "png": png.getvalue(),
        "truncated": whole[: len(whole) * 2 // 3],
    }


EXPECT_REFUSED = {"cmyk", "png"}


# ---- references --------------------------------------------------------------------------------------

def pil_crop_resize(img: Image.Image, box: Sequence[int], size: int) -> np.ndarray:
    """torchvision's resized_crop on a PIL image, then the flip: uint8 (3, size, size)."""
    top, left, h, w, flip = (int(v) for v in box)
    r = img.convert("RGB").crop((left, top, left + w, top + h)).resize((size, size), BILINEAR)
    if flip:
        r = r.transpose(FLIP)
    return np.asarray(r).transpose(2, 0, 1)


def ferry_decoded_as_pil(planes: np.ndarray) -> Image.Image:
    """JpegDecoder.image()'s (channels, h, w) planes as a PIL image."""
    if planes.shape[0] == 1:
        return Image.fromarray(planes[0], "L")
    return Image.fromarray(np.ascontiguousarray(planes.transpose(1, 2, 0)), "RGB")


def info_of(data: bytes) -> Tuple[int, int]:
    """(height, width) by PIL (no decode)."""
    with Image.open(io.BytesIO(data)) as im:
        return im.height, im.width


def boxes_for(datas: Sequence[bytes], seed: int) -> np.ndarray:
    hw = [info_of(d) for d in datas]
    return crop_boxes([h for h, _ in hw], [w for _, w in hw], [seed * 100003 + i for i in range(len(datas))])


# ---- the harness -------------------------------------------------------------------------------------

class Checks:
    """Named checks, each pass or fail with what it saw."""

    def __init__(self) -> None:
        self.results: Dict[str, Dict[str, Any]] = {}
        self.tag = ""  # appended to every name ("@threads=1") while the checks run again under other options

    def add(self, name: str, ok: bool, **seen: Any) -> None:
        name = f"{name}@{self.tag}" if self.tag else name
        prev = self.results.get(name)
        if prev is not None:
            prev["ok"] = prev["ok"] and ok
            prev.setdefault("notes", []).append(seen)
            if not ok:
                self._print(name, ok, seen)
            return
        self.results[name] = {"ok": ok, **seen}
        self._print(name, ok, seen)

    @staticmethod
    def _print(name: str, ok: bool, seen: Dict[str, Any]) -> None:
        print(f"  [{'ok' if ok else 'FAIL'}] {name}: {json.dumps(seen, default=str)[:300]}", flush=True)

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a check that raised is a failed check, named
            self.add(name, False, error=f"{type(e).__name__}: {e}"[:2000])

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.results.values())


def decode_u8(dec: JpegDecoder, datas: Sequence[bytes], boxes: np.ndarray, size: int, stream: torch.cuda.Stream,
              layout: str = "nchw", statuses: bool = True) -> Tuple[torch.Tensor, Optional[np.ndarray]]:
    n = len(datas)
    with torch.cuda.stream(stream):
        shape = (n, 3, size, size) if layout == "nchw" else (n, size, size, 3)
        out = torch.empty(shape, dtype=torch.uint8, device=DEVICE)
        codes = dec.decode(datas, boxes, size=size, out=out.data_ptr(), stream=stream.cuda_stream, layout=layout,
                           statuses=statuses)
    stream.synchronize()
    return out, codes


def compare_kernel(dec: JpegDecoder, out: np.ndarray, boxes: np.ndarray, index: int, size: int) -> Dict[str, Any]:
    """ferry's output of sample `index` against PIL's crop + resize of ferry's own decoded image."""
    ref = pil_crop_resize(ferry_decoded_as_pil(dec.image(index)), boxes[index], size)
    d = np.abs(out[index].astype(np.int16) - ref.astype(np.int16))
    return {"max": int(d.max()), "mismatched": int((d > 0).sum())}


def compare_pil(data: bytes, out: np.ndarray, box: np.ndarray, index: int, size: int) -> Dict[str, Any]:
    ref = pil_crop_resize(Image.open(io.BytesIO(data)), box, size)
    d = np.abs(out[index].astype(np.int16) - ref.astype(np.int16)).astype(np.float64)
    return {"mean": float(d.mean()), "max": int(d.max()), "p999": float(np.percentile(d, 99.9))}


def bench(fn: Callable[[int], None], iters: int, warmup: int, batch: int) -> Dict[str, float]:
    """images/s and ms per batch over the loop; CPU seconds per batch of the whole process (every thread) and of
    the calling thread alone (what a training loop that calls fn pays); the mean wall time of one fn call."""
    for k in range(warmup):
        fn(k)
    torch.cuda.synchronize()
    calls = 0.0
    cpu0, mine0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    for k in range(iters):
        c0 = time.perf_counter()
        fn(warmup + k)
        calls += time.perf_counter() - c0
    torch.cuda.synchronize()
    wall, cpu, mine = time.perf_counter() - t0, time.process_time() - cpu0, time.thread_time() - mine0
    return {"images_per_s": batch * iters / wall, "ms_per_batch": wall / iters * 1e3, "cpu_s_per_batch": cpu / iters,
            "caller_cpu_s_per_batch": mine / iters, "call_ms": calls / iters * 1e3}


# ---- the checks --------------------------------------------------------------------------------------

def check_kinds(checks: Checks, dev: Device, backend: str, size: int, stream: torch.cuda.Stream,
                threads: Optional[int]) -> None:
    specials = special_jpegs()
    # Every kind three times: a batch the default threads split into parts, each holding several kinds.
    names = [f"{k}#{r}" for r in range(3) for k in specials]
    datas = [specials[k.split("#")[0]] for k in names]
    hw = []
    for d in datas:
        try:
            hw.append(info_of(d))
        except Exception:  # noqa: BLE001 - not an image PIL sizes: a box of 1x1 still passes the C checks
            hw.append((1, 1))
    boxes = crop_boxes([h for h, _ in hw], [w for _, w in hw], list(range(len(names))))
    for r in range(3):
        boxes[names.index(f"large_2000x1500#{r}")] = (0, 0, 1500, 2000, 1)  # full: 8.9x downscale, 19 taps
        boxes[names.index(f"small_120x90#{r}")] = (10, 5, 80, 110, 0)        # upscale
    with JpegDecoder(dev, backend=backend, threads=threads) as dec:
        out, codes = decode_u8(dec, datas, boxes, size, stream)
        got = dict(zip(names, (int(c) for c in codes)))
        kind = {k: k.split("#")[0] for k in names}
        expect_ok = [k for k in names if kind[k] not in EXPECT_REFUSED and kind[k] != "truncated"]
        truncated = {got[k] for k in names if kind[k] == "truncated"}
        checks.add(f"kinds[{backend}].statuses", all(got[k] == 0 for k in expect_ok) and
                   all(got[k] == 1 for k in names if kind[k] in EXPECT_REFUSED),
                   statuses=got, truncated=sorted(truncated), threads=dec.stats().get("threads"))
        o = out.cpu().numpy()
        for k in names:
            i = names.index(k)
            if got[k] != 0:
                checks.add(f"kinds[{backend}].refused_are_zero", bool((o[i] == 0).all()), sample=k)
                continue
            kc = compare_kernel(dec, o, boxes, i, size)
            checks.add(f"kinds[{backend}].kernel", kc["max"] == 0, sample=k, **kc)
            if kind[k] != "truncated":
                ec = compare_pil(datas[i], o, boxes[i], i, size)
                checks.add(f"kinds[{backend}].end_to_end", ec["mean"] <= END_TO_END_MEAN, sample=k, **ec)
        checks.add(f"kinds[{backend}].stats", True, **dec.stats())


def check_floats_and_layouts(checks: Checks, dec: JpegDecoder, datas: List[bytes], boxes: np.ndarray, size: int,
                             stream: torch.cuda.Stream) -> None:
    u8, _ = decode_u8(dec, datas, boxes, size, stream)
    u8h, _ = decode_u8(dec, datas, boxes, size, stream, layout="nhwc")
    checks.add("layouts.nhwc_is_nchw_permuted", bool(torch.equal(u8h.permute(0, 3, 1, 2), u8)))
    ref32 = (u8.cpu().numpy().astype(np.float32) / np.float32(255)
             - np.array(MEAN, np.float32)[None, :, None, None]) / np.array(STD, np.float32)[None, :, None, None]
    ref = torch.from_numpy(ref32)
    n = len(datas)
    for dtype, tdtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        for layout in ("nchw", "nhwc"):
            with torch.cuda.stream(stream):
                shape = (n, 3, size, size) if layout == "nchw" else (n, size, size, 3)
                out = torch.empty(shape, dtype=tdtype, device=DEVICE)
                dec.decode(datas, boxes, size=size, out=out.data_ptr(), stream=stream.cuda_stream, dtype=dtype,
                           layout=layout, mean=MEAN, std=STD)
            stream.synchronize()
            got = (out.cpu() if layout == "nchw" else out.cpu().permute(0, 3, 1, 2)).contiguous()
            want = ref.to(tdtype)
            same = bool(torch.equal(got.view(torch.int16 if tdtype != torch.float32 else torch.int32),
                                    want.view(torch.int16 if tdtype != torch.float32 else torch.int32)))
            diff = float((got.float() - want.float()).abs().max())
            checks.add("floats.bit_exact", same, dtype=dtype, layout=layout, max_abs_diff=diff)


def check_refusals(checks: Checks, dec: JpegDecoder, datas: List[bytes], boxes: np.ndarray,
                   stream: torch.cuda.Stream) -> None:
    out = torch.empty((2, 3, 64, 64), dtype=torch.float32, device=DEVICE)

    def refused(name: str, exc: type, match: str, **kw: Any) -> None:
        args = dict(samples=datas[:2], boxes=boxes[:2], size=64, out=out.data_ptr(), stream=stream.cuda_stream)
        args.update(kw)
        try:
            dec.decode(**args)
        except exc as e:
            checks.add("refusals", match in str(e), case=name, message=str(e)[:200])
            return
        except Exception as e:  # noqa: BLE001
            checks.add("refusals", False, case=name, raised=f"{type(e).__name__}: {e}"[:200])
            return
        checks.add("refusals", False, case=name, raised="nothing")

    refused("size 0", _c.InvalidArgumentError, "size = 0", size=0)
    bad = boxes[:2].copy()
    bad[1] = (0, 0, 100000, 10, 0)
    refused("box outside", _c.InvalidArgumentError, "sample 1: crop box", boxes=bad)
    refused("dtype", ValueError, "dtype 'int8'", dtype="int8")
    refused("std 0", _c.InvalidArgumentError, "std", dtype="float32", mean=MEAN, std=(0.2, 0.0, 0.2))
    cmyk = special_jpegs()["cmyk"]
    refused("cmyk without statuses", _c.InputError, "sample 1", samples=[datas[0], cmyk],
            boxes=np.array([boxes[0], (0, 0, 100, 100, 0)], np.int32))
    # 48 samples (split into parts by the default threads): a CMYK at 20 and a PNG at 40; the first is named.
    many, many_boxes = list(datas[:48]), boxes[:48].copy()
    many[20], many[40] = cmyk, special_jpegs()["png"]
    out48 = torch.empty((48, 3, 64, 64), dtype=torch.uint8, device=DEVICE)
    refused("first of two undecodable in a split batch", _c.InputError, "sample 20 of the batch", samples=many,
            boxes=many_boxes, out=out48.data_ptr())


def check_ordering(checks: Checks, dec: JpegDecoder, datas: List[bytes], boxes: np.ndarray, size: int,
                   stream: torch.cuda.Stream) -> None:
    want, _ = decode_u8(dec, datas, boxes, size, stream)
    again, _ = decode_u8(dec, datas, boxes, size, stream)
    checks.add("ordering.deterministic", bool(torch.equal(want, again)))
    n = len(datas)
    with torch.cuda.stream(stream):
        out = torch.empty((n, 3, size, size), dtype=torch.uint8, device=DEVICE)
        torch.cuda._sleep(int(50e-3 * 1.5e9))  # ~50 ms of GPU clock cycles queued first on the consumer
        out.fill_(7)
        dec.decode(datas, boxes, size=size, out=out.data_ptr(), stream=stream.cuda_stream)
    stream.synchronize()
    checks.add("ordering.after_consumer_work", bool(torch.equal(out, want)))
    # The legacy default stream (handle 0): ferry bridges it; the output is there once it is synchronized.
    out0 = torch.empty((n, 3, size, size), dtype=torch.uint8, device=DEVICE)
    torch.cuda._sleep(int(20e-3 * 1.5e9))
    out0.fill_(9)
    dec.decode(datas, boxes, size=size, out=out0.data_ptr(), stream=torch.cuda.default_stream().cuda_stream)
    torch.cuda.synchronize()
    checks.add("ordering.default_stream", bool(torch.equal(out0, want)))


def check_busy_reuse(checks: Checks, dev: Device, pool: List[bytes], size: int, stream: torch.cuda.Stream,
                     threads: Optional[int]) -> None:
    """One scratch set and a consumer stream 100 ms behind: batch B's decode (into the planes batch A's kernel
    has not read yet) must not reach A's output. The hardware engines write when nvjpegDecodeBatched is
    called, whatever the decode stream waits for (torchcodec#1634), so the decoder waits on the host."""
    a, b = pool[:64], pool[64:128]
    boxes_a, boxes_b = boxes_for(a, seed=7), boxes_for(b, seed=8)
    with JpegDecoder(dev, buffers=1, threads=threads) as dec:
        want_a, _ = decode_u8(dec, a, boxes_a, size, stream)
        want_b, _ = decode_u8(dec, b, boxes_b, size, stream)
        with torch.cuda.stream(stream):
            out_a, out_b = torch.empty_like(want_a), torch.empty_like(want_b)
            torch.cuda._sleep(int(100e-3 * 1.5e9))
            t0 = time.perf_counter()
            dec.decode(a, boxes_a, size=size, out=out_a.data_ptr(), stream=stream.cuda_stream)
            dec.decode(b, boxes_b, size=size, out=out_b.data_ptr(), stream=stream.cuda_stream)
            calls_ms = (time.perf_counter() - t0) * 1e3
        stream.synchronize()
        checks.add("ordering.scratch_reuse_behind_busy_consumer",
                   bool(torch.equal(out_a, want_a) and torch.equal(out_b, want_b)), calls_ms=round(calls_ms, 1),
                   hardware_images=dec.stats()["hardware_images"])


def check_reuse(checks: Checks, dev: Device, pool: List[bytes], size: int, stream: torch.cuda.Stream,
                threads: Optional[int]) -> None:
    for buffers in (1, 2):
        with JpegDecoder(dev, buffers=buffers, threads=threads) as dec:
            at = 0
            for n in (1, 7, 256, 3, 256):
                datas = pool[at:at + n]
                at += n
                boxes = boxes_for(datas, seed=at)
                out, codes = decode_u8(dec, datas, boxes, size, stream)
                o = out.cpu().numpy()
                worst = max(compare_kernel(dec, o, boxes, i, size)["max"] for i in {0, n // 2, n - 1})
                checks.add("reuse.kernel", worst == 0 and not codes.any(), buffers=buffers, n=n, max=worst)


# ---- --dry-run: the script's own code on a CPU, PIL standing in for ferry's decoder -----------------------

class _FakeStream:
    cuda_stream = 0

    def synchronize(self) -> None:
        pass


class _FakeDevice:
    def __init__(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _FakeDecoder:
    """JpegDecoder's interface with PIL doing the work on the host, writing the bytes the real decoder would
    write through the same output pointer. Checks nothing about ferry: it runs the script's code paths."""

    def __init__(self, dev: Any, *, backend: str = "auto", buffers: int = 2, threads: Optional[int] = None,
                 library_dirs: Any = None) -> None:
        self._threads = threads or 4
        self._planes: List[np.ndarray] = []
        self._images = 0

    def __enter__(self) -> "_FakeDecoder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        pass

    def decode(self, samples: Sequence[Any], boxes: Any, *, size: int, out: int, stream: int, dtype: str = "uint8",
               layout: str = "nchw", mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
               statuses: bool = False) -> Optional[np.ndarray]:
        import ctypes
        dtypes = {"uint8": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype not in dtypes:
            raise ValueError(f"JpegDecoder.decode: dtype {dtype!r} is not one of {', '.join(dtypes)}")
        if size < 1:
            raise _c.InvalidArgumentError(f"GPU JPEG decode: size = {size}; it must be 1..8192", 1)
        if dtype != "uint8" and min(std or (1.0,)) <= 0:
            raise _c.InvalidArgumentError(f"GPU JPEG decode: std = {std}; std must be > 0", 1)
        n = len(samples)
        codes = np.zeros(n, np.int32)
        vals = np.zeros((n, 3, size, size), np.uint8)
        planes: List[np.ndarray] = []
        for i, data in enumerate(samples):
            try:
                im = Image.open(io.BytesIO(bytes(data)))
                if im.format != "JPEG" or im.mode not in ("RGB", "L"):
                    raise ValueError(f"a {im.format} {im.mode} image")
                im.load()
            except Exception as e:  # noqa: BLE001
                if not statuses:
                    raise _c.InputError(f"GPU JPEG decode: sample {i} of the batch: {e}", 5) from None
                codes[i] = 1
                planes.append(np.zeros((0, 1, 1), np.uint8))
                continue
            t, l, h, w, _ = (int(v) for v in boxes[i])
            if t < 0 or l < 0 or h < 1 or w < 1 or t + h > im.height or l + w > im.width:
                raise _c.InvalidArgumentError(f"GPU JPEG decode: sample {i}: crop box {tuple(boxes[i])} does "
                                              f"not lie inside the {im.height} x {im.width} image", 1)
            planes.append(np.asarray(im)[None] if im.mode == "L" else np.asarray(im).transpose(2, 0, 1))
            vals[i] = pil_crop_resize(im, boxes[i], size)
        self._planes = planes
        self._images += n
        arr = vals if layout == "nchw" else vals.transpose(0, 2, 3, 1)
        if dtype == "uint8":
            raw = np.ascontiguousarray(arr).tobytes()
        else:
            shape = (1, 3, 1, 1) if layout == "nchw" else (1, 1, 1, 3)
            m = np.array(mean or (0, 0, 0), np.float32).reshape(shape)
            sd = np.array(std or (1, 1, 1), np.float32).reshape(shape)
            f = (arr.astype(np.float32) / np.float32(255) - m) / sd
            f[codes != 0] = 0
            t32 = torch.from_numpy(np.ascontiguousarray(f)).to(dtypes[dtype])
            raw = (t32.view(torch.int16) if dtype != "float32" else t32).numpy().tobytes()
        ctypes.memmove(out, raw, len(raw))
        return codes if statuses else None

    def image(self, index: int) -> np.ndarray:
        return self._planes[index]

    def stats(self) -> Dict[str, Any]:
        return {"backend": "dry-run", "hardware_absent": "dry run: PIL on the host", "hardware_engines": 0,
                "hardware_cores_per_engine": 0, "hardware_images": 0, "images": self._images,
                "threads": self._threads}


def install_dry_run() -> None:
    """Runs every check and the bench loop on the CPU with _FakeDecoder (no GPU, no nvJPEG, no torchvision)."""
    global DEVICE, Device, JpegDecoder, library_info
    import contextlib
    DEVICE = "cpu"
    Device, JpegDecoder = _FakeDevice, _FakeDecoder  # type: ignore[misc,assignment]
    library_info = lambda library_dirs=None: {  # noqa: E731
        "available": True, "path": "(dry run)", "version": "0.0.0", "error": "", "tried": []}
    torch.cuda.Stream = _FakeStream  # type: ignore[misc,assignment]
    torch.cuda.stream = lambda s: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda._sleep = lambda cycles: None  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a: None  # type: ignore[assignment]
    torch.cuda.default_stream = lambda *a: _FakeStream()  # type: ignore[assignment]
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *a: "dry run (CPU)"  # type: ignore[assignment]


# ---- main --------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--images", type=int, default=1024, help="distinct JPEGs the bench cycles through")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--json", default=None, help="default: $OUT/gpu_image.json when OUT is set")
    ap.add_argument("--skip-torchvision", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="run the script's code on the CPU with PIL standing in for ferry's decoder (checks nothing "
                         "of ferry's; for editing this script without a GPU)")
    args = ap.parse_args()
    if args.dry_run:
        install_dry_run()
        args.skip_torchvision = True
    checks = Checks()
    doc: Dict[str, Any] = {"args": vars(args), "torch": torch.__version__, "python": sys.version.split()[0]}

    lib = library_info()
    doc["nvjpeg"] = lib
    doc["nvjpeg_dirs_of_python"] = nvjpeg_dirs()
    print(f"nvJPEG: available={lib['available']} path={lib['path']!r} version={lib['version']!r}")
    if not lib["available"]:
        print(lib["error"])
    checks.add("library", lib["available"], path=lib["path"], version=lib["version"])
    if not lib["available"] or not torch.cuda.is_available():
        doc["checks"] = checks.results
        write(doc, args.json)
        return 1
    doc["gpu"] = torch.cuda.get_device_name(0)
    dev = Device("cuda", 0)
    stream = torch.cuda.Stream()
    size, batch = args.size, args.batch

    t = time.perf_counter()
    pool = regular_jpegs(max(args.images, batch))
    print(f"made {len(pool)} JPEGs in {time.perf_counter() - t:.1f} s "
          f"(mean {np.mean([len(p) for p in pool]) / 1024:.0f} KiB)", flush=True)
    try:
        dec = JpegDecoder(dev, threads=SPLIT)
    except Exception as e:  # noqa: BLE001 - reported, with the JSON written
        checks.add("library.decoder", False, error=f"{type(e).__name__}: {e}"[:2000])
        doc["checks"] = checks.results
        write(doc, args.json)
        return 1
    st = dec.stats()
    doc["decoder"] = st
    print(f"decoder backend: {st['backend']} ({st['hardware_absent'] or 'hardware engines in use'}); "
          f"engines {st['hardware_engines']} x {st['hardware_cores_per_engine']} cores; threads {st['threads']}")
    checks.add("library.backend", True, backend=st["backend"], hardware_absent=st["hardware_absent"])

    first = pool[:batch]
    first_boxes = boxes_for(first, seed=1)
    # Every check with the default threads (dec), then again with threads=1 (the calling thread alone).
    with JpegDecoder(dev, threads=1) as dec1:
        for threads, d in ((SPLIT, dec), (1, dec1)):
            checks.tag = "" if threads == SPLIT else f"threads={threads}"
            checks.run("kinds[auto]", lambda: check_kinds(checks, dev, "auto", size, stream, threads))
            checks.run("kinds[software]", lambda: check_kinds(checks, dev, "software", size, stream, threads))
            checks.run("floats", lambda: check_floats_and_layouts(checks, d, first[:32], first_boxes[:32], size,
                                                                  stream))
            checks.run("refusals", lambda: check_refusals(checks, d, first, first_boxes, stream))
            checks.run("ordering", lambda: check_ordering(checks, d, first[:64], first_boxes[:64], size, stream))
            checks.run("reuse", lambda: check_reuse(checks, dev, pool * (1 + 600 // len(pool)), size, stream,
                                                    threads))
            checks.run("busy_reuse", lambda: check_busy_reuse(checks, dev, pool, size, stream, threads))
        checks.tag = ""

    # ---- the bench: batches cycle through the pool
    rows: Dict[str, Dict[str, float]] = {}

    def run_bench() -> None:
        nb = max(1, len(pool) // batch)
        batches = [pool[k * batch:(k + 1) * batch] for k in range(nb)]
        bboxes = [boxes_for(b, seed=100 + k) for k, b in enumerate(batches)]
        with torch.cuda.stream(stream):
            out_u8 = torch.empty((batch, 3, size, size), dtype=torch.uint8, device=DEVICE)
            out_bf = torch.empty((batch, 3, size, size), dtype=torch.bfloat16, device=DEVICE).to(
                memory_format=torch.channels_last)

        def ferry_u8(k: int, d: JpegDecoder) -> None:
            with torch.cuda.stream(stream):
                d.decode(batches[k % nb], bboxes[k % nb], size=size, out=out_u8.data_ptr(),
                         stream=stream.cuda_stream)

        def ferry_bf16(k: int, d: JpegDecoder) -> None:
            with torch.cuda.stream(stream):
                d.decode(batches[k % nb], bboxes[k % nb], size=size, out=out_bf.data_ptr(),
                         stream=stream.cuda_stream, dtype="bfloat16", layout="nhwc", mean=MEAN, std=STD)

        # threads=1 beside the default (dec's), each level.
        default = f"threads={dec.stats()['threads']}"
        soft_iters = max(3, args.iters // 4)
        with JpegDecoder(dev, threads=1) as one, JpegDecoder(dev, backend="software", threads=SPLIT) as soft, \
                JpegDecoder(dev, backend="software", threads=1) as soft1:
            for tag, d, s in (("threads=1", one, soft1), (default, dec, soft)):
                rows[f"ferry uint8 NCHW, {tag}"] = bench(lambda k: ferry_u8(k, d), args.iters, args.warmup, batch)
                rows[f"ferry bf16 NHWC normalised, {tag}"] = bench(lambda k: ferry_bf16(k, d), args.iters,
                                                                   args.warmup, batch)
                rows[f"ferry uint8, software backend, {tag}"] = bench(lambda k: ferry_u8(k, s), soft_iters, 1,
                                                                      batch)
        doc["decoder_after_bench"] = dec.stats()

        if not args.skip_torchvision:
            try:
                rows.update(torchvision_rows(batches, bboxes, size, stream, args))
            except Exception as e:  # noqa: BLE001 - the comparison is optional; its failure is reported
                doc["torchvision_error"] = f"{type(e).__name__}: {e}"
                print(f"torchvision comparison failed: {doc['torchvision_error']}")

        # ---- every bench batch decoded again, 2 samples of each checked
        wrong = 0
        for k in range(nb):
            out, codes = decode_u8(dec, batches[k], bboxes[k], size, stream)
            o = out.cpu().numpy()
            bad = bool(codes.any())
            for i in (k % batch, (k * 37 + batch // 2) % batch):
                kc = compare_kernel(dec, o, bboxes[k], i, size)
                ec = compare_pil(batches[k][i], o, bboxes[k][i], i, size)
                bad = bad or kc["max"] != 0 or ec["mean"] > END_TO_END_MEAN
            wrong += int(bad)
        checks.add("bench_check.wrong_batches", wrong == 0, batches=nb, wrong=wrong)

    checks.run("bench", run_bench)

    print(f"\n{'level':46} {'images/s':>10} {'ms/batch':>9} {'CPU s/batch':>12} {'caller CPU s':>13} "
          f"{'call ms':>8}")
    for name, r in rows.items():
        print(f"{name:46} {r['images_per_s']:10.0f} {r['ms_per_batch']:9.2f} {r['cpu_s_per_batch']:12.4f} "
              f"{r['caller_cpu_s_per_batch']:13.4f} {r['call_ms']:8.2f}")
    doc["bench"] = rows
    doc["checks"] = checks.results
    doc["ok"] = checks.ok
    failed = [k for k, v in checks.results.items() if not v["ok"]]
    print(f"\nchecks: {len(checks.results) - len(failed)} ok, {len(failed)} failed {failed if failed else ''}")
    dec.close()
    dev.close()
    write(doc, args.json)
    return 0 if checks.ok else 1


def torchvision_rows(batches: List[List[bytes]], bboxes: List[np.ndarray], size: int, stream: torch.cuda.Stream,
                     args: argparse.Namespace) -> Dict[str, Dict[str, float]]:
    import torchvision
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as F

    nb, batch = len(batches), len(batches[0])
    tensors = [[torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in bs] for bs in batches]
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    rows = {}

    def decode_only(k: int) -> None:
        with torch.cuda.stream(stream):
            decode_jpeg(tensors[k % nb], device="cuda")

    def decode_crop(k: int) -> None:
        with torch.cuda.stream(stream):
            imgs = decode_jpeg(tensors[k % nb], device="cuda")
            crops = []
            for img, (t, l, h, w, f) in zip(imgs, bboxes[k % nb].tolist()):
                c = F.resized_crop(img, t, l, h, w, [size, size], antialias=True)
                crops.append(c.flip(-1) if f else c)
            x = torch.stack(crops).float().div_(255).sub_(mean).div_(std)
            x.to(torch.bfloat16, memory_format=torch.channels_last)

    print(f"torchvision {torchvision.__version__}", flush=True)
    rows[f"torchvision {torchvision.__version__} decode_jpeg only"] = bench(decode_only, args.iters, args.warmup,
                                                                              batch)
    rows["torchvision decode + v2 resized_crop + norm"] = bench(decode_crop, args.iters, args.warmup, batch)
    return rows


def write(doc: Dict[str, Any], path: Optional[str]) -> None:
    if path is None and os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "gpu_image.json")
    if path is None:
        return
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
