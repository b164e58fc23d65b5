"""ferry's image calls (ferry._native.image): the JPEG header parse on PIL-made JPEGs of every kind and on
garbage and truncations, the crop boxes against a pure-Python reference of the same algorithm and generator,
and the CPU decode + crop + flip against PIL's crop(box).resize(BILINEAR).transpose.

Pixel tolerance (stated in docs/PERFORMANCE.md's CPU JPEG decode too): a box decoded at scale 8/8 (its short
side under 2 x size) is PIL's result but for the pixels next to the decoded region's edges, where libjpeg's
chroma upsampling sees other neighbours than in a whole-image decode: mean absolute error <= 0.05 and 99th
percentile 0. A box decoded at 1/2, 1/4 or 1/8 (DCT scaling: libjpeg's reduced IDCT averages each 8x8 block
down instead of PIL's full decode then triangle filter) differs by a low-pass of another shape: mean <= 2.0,
99th percentile <= 8 (measured on these noisy gradients: 1.34 and 5).
"""
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

import ferry  # noqa: E402
from ferry._native import image as im  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "pytorch"))
import loader_jpeg  # noqa: E402  (its test images)


def picture(w, h, seed=0, mode="RGB"):
    """examples/pytorch/loader_jpeg.py's image `seed`, in `mode`."""
    return Image.fromarray(loader_jpeg.picture(seed, w, h)).convert(mode)


def jpeg(w, h, seed=0, mode="RGB", **save):
    b = io.BytesIO()
    picture(w, h, seed, mode).save(b, "JPEG", quality=save.pop("quality", 90), **save)
    return b.getvalue()


# ---- header parse --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, w, h, save, components, process", [
    ("baseline 4:2:0", 500, 375, {"subsampling": 2}, 3, "baseline"),
    ("baseline 4:4:4", 64, 48, {"subsampling": 0}, 3, "baseline"),
    ("progressive", 333, 217, {"progressive": True}, 3, "progressive"),
    ("odd sizes", 37, 1, {}, 3, "baseline"),
    ("grayscale", 101, 77, {"mode": "L"}, 1, "baseline"),
    ("CMYK", 40, 30, {"mode": "CMYK"}, 4, "baseline"),
])
def test_the_header_parse_reads_size_components_and_process_of_every_kind(kind, w, h, save, components, process):
    save = dict(save)
    data = jpeg(w, h, mode=save.pop("mode", "RGB"), **save)
    info = im.jpeg_info(data)
    assert info.ok and (info.height, info.width) == (h, w), kind
    assert info.components == components and info.process == process and info.precision == 8
    assert info.progressive == (process == "progressive")
    assert info.decodable == (components != 4) and (info.refusal is None) == (components != 4)
    if components == 4:
        assert "CMYK" in info.refusal or "YCCK" in info.refusal
    assert data[info.offset] == 0xFF and 0xC0 <= data[info.offset + 1] <= 0xCF


def test_sampling_factors_say_4_2_0_and_4_4_4():
    # Through the C ABI the sampling is not reported; the decode of both is checked below. The parse of the
    # frame is what both have in common: the same size and components.
    a, b = im.jpeg_info(jpeg(64, 48, subsampling=2)), im.jpeg_info(jpeg(64, 48, subsampling=0))
    assert (a.height, a.width, a.components) == (b.height, b.width, b.components) == (48, 64, 3)


def test_every_truncation_and_garbage_is_reported_never_misread():
    data = jpeg(50, 40)
    full = im.jpeg_info(data)
    frame_end = full.offset + 2 + (data[full.offset + 2] << 8 | data[full.offset + 3])
    for n in range(len(data[:frame_end + 8])):
        info = im.jpeg_info(data[:n])
        if n < 2:
            assert info.status == "not_jpeg", n
        elif n < frame_end:
            assert info.status == "truncated" and not info.decodable and info.refusal, n
        else:
            assert info.ok and (info.height, info.width) == (40, 50), n
    rng = np.random.default_rng(1)
    for i in range(300):
        junk = rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8).tobytes()
        for blob in (junk, b"\xff\xd8" + junk, b"\xff\xd8\xff\xc0" + junk):
            info = im.jpeg_info(blob)
            assert info.offset <= len(blob)
            if info.ok:  # a frame header the junk happened to complete: its fields are what the bytes say
                assert info.height > 0 and info.width > 0 and info.components > 0
    assert im.jpeg_info(b"").status == "not_jpeg" and im.jpeg_info(b"GIF89a").status == "not_jpeg"
    assert im.jpeg_info(b"\xff\xd8\xff\xd9").status == "no_frame"
    assert im.jpeg_info(b"\xff\xd8\xff\xe0\x00\x01").status == "bad_marker"  # a segment length under 2
    # A segment length that runs past the end: truncated, whatever the length claims.
    assert im.jpeg_info(b"\xff\xd8\xff\xe0\xff\xff" + b"\0" * 16).status == "truncated"


# ---- crop boxes --------------------------------------------------------------------------------------

MASK = (1 << 64) - 1


class SplitMix64:
    """The generator of include/ferry/image/crop_box.hpp, in Python."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53

    def below(self, n):
        return (self.next() * n) >> 64


def reference_box(h, w, seed, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), p=0.5):
    """torchvision RandomResizedCrop.get_params, then the flip, drawn in the order crop_box.hpp states."""
    import math
    g = SplitMix64(seed)
    area = h * w
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    box = None
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * g.uniform())
        aspect = math.exp(lo + (hi - lo) * g.uniform())
        bw, bh = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < bw <= w and 0 < bh <= h:
            top = g.below(h - bh + 1)
            box = [top, g.below(w - bw + 1), bh, bw]
            break
    if box is None:
        in_ratio = w / h
        bw, bh = w, h
        if in_ratio < ratio[0]:
            bh = int(round(w / ratio[0]))
        elif in_ratio > ratio[1]:
            bw = int(round(h * ratio[1]))
        box = [(h - bh) // 2, (w - bw) // 2, bh, bw]
    flip = int(g.uniform() < p) if p > 0 else 0
    return box + [flip]


def test_random_resized_boxes_equal_the_python_reference_of_the_same_algorithm_and_generator():
    rng = np.random.default_rng(7)
    n = 3000
    h = rng.integers(1, 2000, n)
    w = rng.integers(1, 2000, n)
    h[:200], w[:200] = 10, rng.integers(200, 3000, 200)  # very wide: the fallback path
    h[200:400], w[200:400] = rng.integers(200, 3000, 200), 7  # very tall
    seeds = rng.integers(0, 2 ** 63, n, dtype=np.uint64) * 2 + 1
    seeds[:5] = [0, 1, 2 ** 64 - 1, 2 ** 63, 12345]
    boxes = im.crop_boxes(h, w, seeds)
    expected = [reference_box(int(a), int(b), int(s)) for a, b, s in zip(h, w, seeds)]
    assert boxes.tolist() == expected
    top, left, bh, bw, flip = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    assert 0.45 < flip.mean() < 0.55 and set(np.unique(flip)) == {0, 1}
    fallback = [reference_box(10, 2000, s) for s in range(20)]  # 10 attempts never fit: centered 4/3 box
    assert all(b[:4] == [0, 993, 10, 13] for b in fallback)
    custom = im.crop_boxes([300] * 50, [400] * 50, range(50), scale=(0.5, 0.9), ratio=(1.0, 1.0),
                           flip_probability=0.0)
    assert custom.tolist() == [reference_box(300, 400, s, (0.5, 0.9), (1.0, 1.0), 0.0) for s in range(50)]
    assert (custom[:, 2] == custom[:, 3]).all() and (custom[:, 4] == 0).all()


def test_center_and_full_boxes():
    assert im.crop_boxes([375], [500], [9], mode="center").tolist() == [[23, 86, 328, 328, 0]]  # 375*224/256
    assert im.crop_boxes([480, 10], [640, 1], [0, 0], mode="full").tolist() == [[0, 0, 480, 640, 0],
                                                                               [0, 0, 10, 1, 0]]
    assert im.crop_boxes([375], [500], [9], mode="center", crop_fraction=1.0).tolist() == [[0, 62, 375, 375, 0]]


def test_bad_box_parameters_are_refused_by_name():
    with pytest.raises(ferry.InvalidArgumentError, match=r"crop scale \(0\.5, 0\.2\)"):
        im.crop_boxes([10], [10], [0], scale=(0.5, 0.2))
    with pytest.raises(ferry.InvalidArgumentError, match=r"sample 1 is 0 x 5 pixels"):
        im.crop_boxes([10, 0], [10, 5], [0, 1])
    with pytest.raises(ValueError, match="crop mode"):
        im.crop_boxes([10], [10], [0], mode="zoom")


# ---- the CPU decode ----------------------------------------------------------------------------------

def pil_reference(data, box, size):
    top, left, h, w, flip = [int(v) for v in box]
    img = Image.open(io.BytesIO(data)).convert("RGB").crop((left, top, left + w, top + h))
    img = img.resize((size, size), Image.BILINEAR)
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def errors(data, box, size=224):
    got = im.decode_crop(data, box, size, layout="hwc")
    e = np.abs(got.astype(np.int32) - pil_reference(data, box, size))
    return float(e.mean()), float(np.percentile(e, 99))


def test_decode_crop_flip_at_full_scale_is_pil_but_near_the_decoded_edges():
    cases = [(jpeg(500, 375, 1), 375, 500), (jpeg(640, 480, 2, subsampling=0), 480, 640),
             (jpeg(333, 217, 3, progressive=True), 217, 333), (jpeg(201, 199, 4, mode="L"), 199, 201)]
    for data, h, w in cases:
        boxes = im.crop_boxes([h] * 12, [w] * 12, range(12))
        assert set(boxes[:, 4]) == {0, 1}
        for b in boxes:
            if min(b[2], b[3]) >= 448:
                continue  # decoded at 1/2: the next test's
            mean, p99 = errors(data, b)
            assert mean <= 0.05 and p99 == 0, (h, w, b.tolist(), mean, p99)
    # A whole-image box at its own size: every pixel is PIL's.
    data = jpeg(120, 90, 5)
    assert (im.decode_crop(data, [0, 0, 90, 120, 0], 90, "hwc") ==
            np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((90, 90), Image.BILINEAR))).all()


def test_decode_crop_with_dct_scaling_stays_within_the_stated_tolerance():
    worst_mean = worst_p99 = 0.0
    for i, (w, h) in enumerate([(1600, 1200), (2000, 1500), (1000, 1000)]):
        data = jpeg(w, h, 10 + i)
        for b in im.crop_boxes([h] * 6, [w] * 6, range(100, 106)):
            mean, p99 = errors(data, b)
            worst_mean, worst_p99 = max(worst_mean, mean), max(worst_p99, p99)
        mean, p99 = errors(data, [0, 0, h, h, 1])  # a box of >= 4 x 224: 1/4 or 1/8
        worst_mean, worst_p99 = max(worst_mean, mean), max(worst_p99, p99)
    assert worst_mean <= 2.0 and worst_p99 <= 8, (worst_mean, worst_p99)


def test_layouts_and_flip_are_the_same_pixels_rearranged():
    data = jpeg(300, 200, 6)
    hwc = im.decode_crop(data, [10, 20, 150, 170, 0], 64, "hwc")
    chw = im.decode_crop(data, [10, 20, 150, 170, 0], 64, "chw")
    flipped = im.decode_crop(data, [10, 20, 150, 170, 1], 64, "chw")
    assert hwc.shape == (64, 64, 3) and chw.shape == (3, 64, 64)
    assert (chw == hwc.transpose(2, 0, 1)).all() and (flipped == chw[:, :, ::-1]).all()
    assert hwc.std() > 10  # a picture, not a constant
    gray = im.decode_crop(jpeg(80, 60, 7, mode="L"), [0, 0, 60, 80, 0], 32, "chw")
    assert (gray[0] == gray[1]).all() and (gray[1] == gray[2]).all()


def test_the_batch_form_equals_one_by_one_and_names_the_failing_sample():
    samples = [jpeg(320 + 16 * i, 240 + 8 * i, 20 + i) for i in range(6)]
    infos = [im.jpeg_info(s) for s in samples]
    boxes = im.crop_boxes([i.height for i in infos], [i.width for i in infos], range(6))
    one = np.stack([im.decode_crop(s, b, 96) for s, b in zip(samples, boxes)])
    for threads in (1, 3, 0):
        assert (im.decode_crop_batch(samples, boxes, 96, threads=threads) == one).all()
    bad = list(samples)
    bad[4] = jpeg(40, 30, mode="CMYK")
    with pytest.raises(ferry.InvalidArgumentError, match=r"sample 4 of 6: .*CMYK"):
        im.decode_crop_batch(bad, boxes, 96, threads=2)


def test_undecodable_inputs_are_refused_with_what_they_are():
    cmyk = jpeg(40, 30, mode="CMYK")
    with pytest.raises(ferry.InvalidArgumentError, match=r"CMYK JPEG \(4 components\)"):
        im.decode_crop(cmyk, [0, 0, 30, 40, 0], 16)
    with pytest.raises(ferry.InvalidArgumentError, match="not a JPEG"):
        im.decode_crop(b"\x89PNG\r\n\x1a\n" + b"\0" * 64, [0, 0, 1, 1, 0], 16)
    data = jpeg(64, 48)
    with pytest.raises(ferry.InvalidArgumentError, match="truncated"):
        im.decode_crop(data[:100], [0, 0, 48, 64, 0], 16)
    with pytest.raises(ferry.InvalidArgumentError, match=r"does not lie inside the 48 x 64 image"):
        im.decode_crop(data, [0, 10, 48, 64, 0], 16)
    with pytest.raises(ferry.InvalidArgumentError, match=r"output size 0 must lie in \[1, 8192\]"):
        im.decode_crop(data, [0, 0, 48, 64, 0], 0)
    # Scan data cut short: libjpeg continues past it with a warning, as PIL does (no error, a full output).
    assert im.decode_crop(data[:len(data) * 2 // 3], [0, 0, 48, 64, 0], 16).shape == (3, 16, 16)


def test_a_missing_libjpeg_says_what_to_install():
    code = ("import sys\n"
            "from ferry._native import image as im\n"
            "try:\n"
            "    im.decode_crop(sys.stdin.buffer.read(), [0, 0, 30, 40, 0], 4)\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    env = dict(os.environ, FERRY_JPEG_LIBRARY="/nonexistent/libjpeg.so.62")
    out = subprocess.run([sys.executable, "-c", code], env=env, input=jpeg(40, 30), capture_output=True,
                         timeout=60)
    out = subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(), out.stderr.decode())
    assert "InvalidArgumentError" in out.stdout and "libjpeg62-turbo" in out.stdout, out.stdout + out.stderr
    assert "/nonexistent/libjpeg.so.62" in out.stdout
