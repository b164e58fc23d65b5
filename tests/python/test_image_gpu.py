"""The GPU JPEG decoder's CPU-side contract (ferry._native.image_gpu): where nvJPEG is looked for and the error
that names what to install when it is missing (never a crash), and arguments refused by name before any
GPU work, and the kernel's resize arithmetic compiled for the host against PIL. The decode itself is checked on
a GPU by scripts/gpu_image.py (every pixel against PIL)."""
import ctypes
import json
import os

import pytest

from ferry import _c
from ferry._native.device import Device
from ferry._native.image_gpu import DTYPES, LAYOUTS, JpegDecoder, library_info

INSTALL_HINT = "nvidia-nvjpeg-cu13"


def loaded_nvjpegs():
    """The nvJPEG files this process has mapped (torchvision's copy, say), which the search tries first."""
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if "/libnvjpeg" in line and "libnvjpeg2k" not in line}


def test_the_library_report_lists_every_name_tried_with_the_given_folders_first(tmp_path):
    info = library_info([str(tmp_path)])
    assert set(info) == {"available", "path", "version", "error", "tried"}
    tried = info["tried"]
    assert tried[:2] == ["libnvjpeg.so.13", "libnvjpeg.so.12"]
    # Then (after an nvJPEG this process already loaded under another name, if any) the given folder, before
    # every other folder.
    first = tried.index(str(tmp_path / "libnvjpeg.so.13"))
    assert tried[first + 1] == str(tmp_path / "libnvjpeg.so.12")
    assert set(tried[2:first]) <= loaded_nvjpegs()
    if info["available"]:
        assert info["path"] and info["version"].count(".") == 2 and info["error"] == ""
    else:
        assert info["path"] == "" and INSTALL_HINT in info["error"] and "FERRY_NVJPEG_LIBRARY" in info["error"]
        # One dlopen answer per name tried, in order.
        assert info["error"].count("dlopen(") == len(tried)


def test_a_folder_is_searched_for_renamed_copies_but_not_for_nvjpeg2k(tmp_path):
    # auditwheel renames a bundled copy (torchvision.libs/libnvjpeg-<hash>.so.12); libnvjpeg2k is JPEG 2000's.
    for name in ("libnvjpeg-1a2b3c4d.so.12", "libnvjpeg2k.so.0", "libnvjpeg.so.13.0.1", "notes.txt"):
        (tmp_path / name).write_bytes(b"not a library")
    tried = library_info([str(tmp_path)])["tried"]
    mine = [t for t in tried if t.startswith(str(tmp_path))]
    assert mine == [str(tmp_path / n) for n in ("libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg-1a2b3c4d.so.12",
                                               "libnvjpeg.so.13.0.1")]


def test_the_environment_variable_names_the_one_library_to_open(tmp_path, monkeypatch):
    missing = tmp_path / "libnvjpeg.so.13"
    monkeypatch.setenv("FERRY_NVJPEG_LIBRARY", str(missing))
    info = library_info([])
    assert info["tried"] == [str(missing)]
    assert not info["available"] and str(missing) in info["error"] and INSTALL_HINT in info["error"]
    # A file that is not a library is refused the same way, naming the file.
    missing.write_bytes(b"not an ELF file")
    info = library_info([])
    assert not info["available"] and str(missing) in info["error"]


def test_a_decoder_on_this_machine_is_refused_with_the_way_out():
    dev = Device("host", 0)
    try:
        with pytest.raises(_c.InvalidArgumentError) as e:
            JpegDecoder(dev)
        message = str(e.value)
        if library_info()["available"]:
            assert "needs a cuda device" in message
        else:
            assert "needs nvJPEG" in message and INSTALL_HINT in message
    finally:
        dev.close()


@pytest.mark.parametrize("options, named", [
    ({"backend": "gpu"}, "backend 'gpu'"),
    ({"buffers": 0}, "buffers = 0"),
    ({"buffers": 9}, "buffers = 9"),
    ({"buffers": "two"}, "buffers = \"two\""),
    ({"library_dirs": "/usr/lib"}, "library_dirs"),
    ({"library_dirs": [3]}, "library_dirs holds 3"),
    ({"colour": "rgb"}, "option 'colour'"),
])
def test_bad_options_are_refused_by_name_before_nvjpeg_is_looked_for(options, named):
    dev = Device("host", 0)
    try:
        out = _c.JpegDecoderHandle()
        with pytest.raises(_c.InvalidArgumentError, match="ferry_jpeg_decoder_create") as e:
            _c.lib.ferry_jpeg_decoder_create(dev.handle, json.dumps(options).encode(), ctypes.byref(out))
        assert named in str(e.value)
        assert not out  # nothing made
    finally:
        dev.close()


@pytest.mark.parametrize("threads, named", [(0, "threads = 0: expected 1..64"), (65, "threads = 65: expected 1..64"),
                                             (2.5, "threads = 2.5: expected an integer"),
                                             ("4", "threads = \"4\": expected an integer")])
def test_the_threads_option_is_refused_out_of_range_and_accepted_in_it(threads, named):
    dev = Device("host", 0)
    try:
        with pytest.raises(_c.InvalidArgumentError, match="ferry_jpeg_decoder_create") as e:
            JpegDecoder(dev, threads=threads)
        assert named in str(e.value)
        # In range the option passes, and the decoder is refused for what this machine lacks instead.
        for good in (1, 64, None):
            with pytest.raises(_c.InvalidArgumentError) as e:
                JpegDecoder(dev, threads=good)
            assert "threads" not in str(e.value)
            assert "needs a cuda device" in str(e.value) or "needs nvJPEG" in str(e.value)
    finally:
        dev.close()


def test_options_that_are_not_json_are_refused_naming_them():
    with pytest.raises(_c.InvalidArgumentError, match="not JSON"):
        _c.lib.ferry_jpeg_gpu_library_json(b"{backend", ctypes.byref(ctypes.c_void_p()))
    with pytest.raises(_c.InvalidArgumentError, match="option 'backend' is not one of library_dirs"):
        _c.lib.ferry_jpeg_gpu_library_json(b'{"backend": "auto"}', ctypes.byref(ctypes.c_void_p()))


def test_the_decoder_calls_refuse_a_null_handle_by_name():
    null = _c.JpegDecoderHandle()
    with pytest.raises(_c.InvalidArgumentError, match="ferry_jpeg_decoder_decode: the handle is NULL"):
        _c.lib.ferry_jpeg_decoder_decode(null, 1, None, None, None, 224, None, 0, 0, None, None, 0, None, None)
    with pytest.raises(_c.InvalidArgumentError, match="ferry_jpeg_decoder_image: the handle is NULL"):
        _c.lib.ferry_jpeg_decoder_image(null, 0, None, 0, None, None, None)
    with pytest.raises(_c.InvalidArgumentError, match="ferry_jpeg_decoder_stats_json: the handle is NULL"):
        _c.lib.ferry_jpeg_decoder_stats_json(null, ctypes.byref(ctypes.c_void_p()))
    _c.lib.ferry_jpeg_decoder_destroy(null)  # accepts NULL


def test_a_handle_of_another_kind_never_reaches_the_decoder():
    with pytest.raises(ctypes.ArgumentError, match="expected a JpegDecoderHandle"):
        _c.lib.ferry_jpeg_decoder_stats_json(_c.ReducerHandle(), ctypes.byref(ctypes.c_void_p()))


def test_the_codes_are_the_headers():
    # ferry.h's ferry_jpeg_decoder_decode: dtype 0 uint8, 1 float32, 2 bfloat16, 3 float16; layout 0 NCHW, 1 NHWC.
    assert DTYPES == {"uint8": 0, "float32": 1, "bfloat16": 2, "float16": 3}
    assert LAYOUTS == {"nchw": 0, "nhwc": 1}


# The kernel's arithmetic (src/image/cuda/resize_math.hpp, the very code the kernel runs) compiled for the host
# and run over random crops of noise images: every output byte equals PIL's crop + resize(BILINEAR) + flip.
_RESAMPLE_MAIN = r"""
#include <cstdio>
#include <vector>
#include "resize_math.hpp"
using namespace ferry::image::cuda_kernels;
int main() {  // stdin: C H W '\n' planes, then n size and n boxes; stdout: n x 3 x size x size bytes
  int c = 0, h = 0, w = 0, n = 0, size = 0;
  if (std::scanf("%d %d %d", &c, &h, &w) != 3) return 1;
  std::fgetc(stdin);
  std::vector<std::uint8_t> img(static_cast<std::size_t>(c) * h * w);
  if (std::fread(img.data(), 1, img.size(), stdin) != img.size() || std::scanf("%d %d", &n, &size) != 2) return 2;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n) * 3 * size * size);
  for (int i = 0; i < n; ++i) {
    sample_desc s;
    s.planes = img.data(); s.plane_bytes = static_cast<std::uint64_t>(h) * w; s.pitch = w; s.channels = c;
    if (std::scanf("%d %d %d %d %d", &s.top, &s.left, &s.height, &s.width, &s.flip) != 5) return 3;
    for (int y = 0; y < size; ++y)
      for (int x = 0; x < size; ++x) {
        int v[3];
        resample_pixel(s, size, x, y, v);
        for (int k = 0; k < 3; ++k) out[((static_cast<std::size_t>(i) * 3 + k) * size + y) * size + x] = v[k];
      }
  }
  return std::fwrite(out.data(), 1, out.size(), stdout) == out.size() ? 0 : 4;
}
"""


def test_the_kernels_arithmetic_is_pillows_bilinear_byte_for_byte(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path

    np = pytest.importorskip("numpy")
    Image = pytest.importorskip("PIL.Image")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "resample.cpp"
    src.write_text(_RESAMPLE_MAIN)
    exe = tmp_path / "resample"
    subprocess.run([cxx, "-std=c++20", "-O1", "-ffp-contract=off", f"-I{root / 'src' / 'image' / 'cuda'}",
                    str(src), "-o", str(exe)], check=True)
    bilinear = getattr(Image, "Resampling", Image).BILINEAR
    flip = getattr(Image, "Transpose", Image).FLIP_LEFT_RIGHT
    rng = np.random.default_rng(39)
    # Downscales of up to 9x (19 taps), upscales, extreme aspects, 1-pixel boxes, size 1, grayscale.
    for (h, w, size) in [(480, 640, 224), (375, 500, 96), (90, 120, 224), (1500, 2000, 48), (40, 1000, 17),
                         (224, 224, 224), (7, 5, 1)]:
        for channels in (3, 1):
            img = rng.integers(0, 256, (channels, h, w), dtype=np.uint8)
            boxes = [(0, 0, h, w, 0), (0, 0, h, w, 1), (h - 1, w - 1, 1, 1, 0)]
            for _ in range(5):
                bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
                boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw,
                              int(rng.integers(0, 2))))
            stdin = (f"{channels} {h} {w}\n".encode() + img.tobytes() + f"\n{len(boxes)} {size}\n".encode()
                     + " ".join(" ".join(map(str, b)) for b in boxes).encode())
            got = np.frombuffer(subprocess.run([str(exe)], input=stdin, capture_output=True, check=True).stdout,
                                np.uint8).reshape(len(boxes), 3, size, size)
            pil = (Image.fromarray(img[0], "L").convert("RGB") if channels == 1
                   else Image.fromarray(np.ascontiguousarray(img.transpose(1, 2, 0)), "RGB"))
            for i, (t, l, bh, bw, f) in enumerate(boxes):
                ref = pil.crop((l, t, l + bw, t + bh)).resize((size, size), bilinear)
                ref = np.asarray(ref.transpose(flip) if f else ref).transpose(2, 0, 1)
                assert np.array_equal(got[i], ref), (
                    f"{channels}x{h}x{w} box {(t, l, bh, bw, f)} -> {size}: "
                    f"{int((got[i] != ref).sum())} bytes differ, by up to "
                    f"{int(np.abs(got[i].astype(int) - ref.astype(int)).max())}")


def test_the_native_device_names_its_ordinal_for_the_decoders_output():
    # ferry.torch allocates a decoder's output on torch.device("cuda", decoder.device.ordinal).
    dev = Device("host", 0)
    try:
        assert dev.ordinal == 0 == dev.info["ordinal"]
    finally:
        dev.close()
