#!/usr/bin/env python3
"""ferry's CPU JPEG decode + random-resized crop + flip per sample against PIL's decode-then-crop, one thread.

The PIL path is examples/pytorch/loader_jpeg.py's JpegFolder._make: Image.open(...).convert("RGB"), then
resize((size, size), BILINEAR, box=crop), then transpose(FLIP_LEFT_RIGHT) when flipped, then np.array.
ferry's path: ferry._native.image.jpeg_info (header), crop_boxes (the box), decode_crop (CHW uint8: DCT
scaling, crop-region decode, PIL's BILINEAR resample, the flip). Both read the same in-memory JPEGs with the
same boxes (ferry's), so the work differs only by how it is done; file reads are outside the timing.

Images: as loader_jpeg.py makes them (smooth gradients with noise, 500x375 to 640x480, quality 90), and a
set of large ones (1600x1200 to 2048x1536). Per set and path: the median over --repeats passes of the
mean ms a sample; the ratio is ferry's over PIL's (the goal of issue 39: <= 0.5). Every pass checks one
sample's pixels against PIL's crop(box).resize(BILINEAR) (tests/python/test_image.py's tolerance: mean
absolute error <= 2, 99th percentile <= 8) and exits 1 when one is off.

  FERRY_LIBRARY=build/default/src/c/libferry_c.so PYTHONPATH=python python3 scripts/bench_jpeg_cpu.py [--json OUT]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "examples" / "pytorch"))
from ferry._native import image as fim  # noqa: E402
from loader_jpeg import picture  # noqa: E402


def make_jpeg(i: int, w: int, h: int) -> bytes:
    """loader_jpeg.py's image i, encoded into memory as its files are (q90)."""
    b = io.BytesIO()
    Image.fromarray(picture(i, w, h)).save(b, "JPEG", quality=90)
    return b.getvalue()


def image_set(n: int, wmin: int, wmax: int, hmin: int, hmax: int, seed: int) -> list[bytes]:
    out = []
    for i in range(n):
        rng = np.random.default_rng(seed + i)
        out.append(make_jpeg(seed + i, int(rng.integers(wmin, wmax + 1)), int(rng.integers(hmin, hmax + 1))))
    return out


def pil_sample(data: bytes, box, size: int) -> np.ndarray:
    top, left, h, w, flip = box
    img = Image.open(io.BytesIO(data)).convert("RGB")
    img = img.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.array(img)


def ferry_sample(data: bytes, seed: int, size: int, out: np.ndarray) -> np.ndarray:
    info = fim.jpeg_info(data)
    box = fim.crop_boxes([info.height], [info.width], [seed])[0]
    return fim.decode_crop(data, box, size, "chw", out=out)


def check(data: bytes, seed: int, size: int) -> dict:
    info = fim.jpeg_info(data)
    box = fim.crop_boxes([info.height], [info.width], [seed])[0]
    got = fim.decode_crop(data, box, size, "hwc")
    top, left, h, w, flip = (int(v) for v in box)
    ref = Image.open(io.BytesIO(data)).convert("RGB").crop((left, top, left + w, top + h))
    ref = ref.resize((size, size), Image.BILINEAR)
    if flip:
        ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
    e = np.abs(got.astype(np.int32) - np.asarray(ref))
    mean, p99 = float(e.mean()), float(np.percentile(e, 99))
    return {"box": [int(v) for v in box], "mean_abs": round(mean, 4), "p99_abs": p99,
            "ok": mean <= 2.0 and p99 <= 8}


def run_set(name: str, images: list[bytes], size: int, repeats: int) -> dict:
    infos = [fim.jpeg_info(d) for d in images]
    seeds = list(range(len(images)))
    boxes = fim.crop_boxes([i.height for i in infos], [i.width for i in infos], seeds)
    out = np.empty((3, size, size), np.uint8)
    passes = {"pil": [], "ferry": []}
    checks = []
    for r in range(repeats + 1):  # pass 0 warms up
        for path in ("pil", "ferry") if r % 2 == 0 else ("ferry", "pil"):
            t0 = time.perf_counter()
            if path == "pil":
                for d, b in zip(images, boxes.tolist()):
                    pil_sample(d, b, size)
            else:
                for d, s in zip(images, seeds):
                    ferry_sample(d, s, size, out)
            ms = (time.perf_counter() - t0) * 1e3 / len(images)
            if r > 0:
                passes[path].append(ms)
        checks.append(check(images[r % len(images)], r % len(images), size))
    pil, fer = statistics.median(passes["pil"]), statistics.median(passes["ferry"])
    return {"set": name, "images": len(images),
            "sizes": f"{min(i.width for i in infos)}x{min(i.height for i in infos)}.."
                     f"{max(i.width for i in infos)}x{max(i.height for i in infos)}",
            "kb_mean": round(sum(len(d) for d in images) / len(images) / 1024, 1),
            "pil_ms": round(pil, 3), "ferry_ms": round(fer, 3), "ratio": round(fer / pil, 3),
            "pil_passes": [round(v, 3) for v in passes["pil"]], "ferry_passes": [round(v, 3) for v in passes["ferry"]],
            "checks": checks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=64, help="loader_jpeg-sized images (500x375..640x480)")
    ap.add_argument("--large", type=int, default=16, help="large images (1600x1200..2048x1536)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=7, help="timed passes per path (median reported)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sets = [("loader_jpeg", image_set(args.images, 500, 640, 375, 480, 10_000)),
            ("large", image_set(args.large, 1600, 2048, 1200, 1536, 20_000))]
    results = [run_set(name, imgs, args.size, args.repeats) for name, imgs in sets if imgs]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    report = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
              "pil": Image.__version__, "size": args.size, "threads": 1, "results": results}
    print(f"CPU: {cpu} ({os.cpu_count()} cores), one thread, output {args.size}x{args.size}, PIL {Image.__version__}")
    print(f"{'set':<12} {'images':>6} {'sizes':>22} {'KB':>6} {'PIL ms':>8} {'ferry ms':>9} {'ratio':>6}  pixels")
    bad = 0
    for r in results:
        ok = all(c["ok"] for c in r["checks"])
        bad += not ok
        worst = max(c["mean_abs"] for c in r["checks"]), max(c["p99_abs"] for c in r["checks"])
        print(f"{r['set']:<12} {r['images']:>6} {r['sizes']:>22} {r['kb_mean']:>6} {r['pil_ms']:>8.3f} "
              f"{r['ferry_ms']:>9.3f} {r['ratio']:>6.3f}  {'ok' if ok else 'WRONG'} "
              f"({len(r['checks'])} checked, worst mean {worst[0]:.3f}, p99 {worst[1]:.0f})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
