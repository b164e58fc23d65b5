"""ferry.torch.Loader(decode=ImageDecode(...)) on the emulated device: the CPU decode's batches equal
ImageDecode.reference for each sample's seed (every pixel, every batch), whatever the workers, the memory
format and the sample's structure; the refusals name what is wrong. The device decode's own checks are
tests/python/test_image_gpu.py's and scripts/gpu_image.py's (a GPU)."""
from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

import ferry.torch as ft  # noqa: E402


def _jpegs(n, seed=0, progressive_every=4, gray_every=5):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = int(rng.integers(40, 120)), int(rng.integers(40, 120))
        a = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        img = Image.fromarray(a)
        if gray_every and i % gray_every == gray_every - 1:
            img = img.convert("L")
        b = io.BytesIO()
        img.save(b, "JPEG", quality=90, progressive=bool(progressive_every and i % progressive_every == 1))
        out.append(b.getvalue())
    return out


IMAGES = _jpegs(13)


class Files(torch.utils.data.Dataset):
    """(the JPEG's bytes, index), as an ImageFolder without the decode; `kind` picks the sample's shape."""

    def __init__(self, images=IMAGES, kind="tuple"):
        self.images, self.kind = images, kind

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        data = self.images[i]
        if self.kind == "dict":
            return {"label": i, "jpeg": np.frombuffer(data, dtype=np.uint8)}
        if self.kind == "alone":
            return bytearray(data)
        return data, i


def _unnormalised(x, decode):
    if decode.mean is None:
        return x.float()
    m = torch.tensor(decode.mean).view(3, 1, 1)
    s = torch.tensor(decode.std).view(3, 1, 1)
    return (x.float() * s + m) * 255


def _check(loader, decode, epoch, indices_of):
    seen = 0
    for batch in loader:
        x, idx = indices_of(batch)
        assert x.shape == (len(idx), 3, decode.size, decode.size)
        assert x.dtype == decode.dtype
        if decode.channels_last:
            assert x.is_contiguous(memory_format=torch.channels_last)
        for j, i in enumerate(idx):
            ref = decode.reference(IMAGES[i], ft.sample_seed(loader.seed, epoch, i)).float()
            diff = (_unnormalised(x[j], decode) - ref).abs().max().item()
            assert diff < 0.02, f"sample {i}: off by {diff} levels"
            seen += 1
    return seen


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_decode_batches_equal_the_reference(workers, channels_last):
    decode = ft.ImageDecode(24, channels_last=channels_last, where="cpu")
    with ft.Loader(Files(), batch_size=4, workers=workers, shuffle=True, seed=7, decode=decode, device="host") as L:
        for epoch in range(2):
            assert _check(L, decode, epoch, lambda b: (b[0], [int(i) for i in b[1]])) == len(IMAGES)


def test_the_crops_follow_the_seed_and_epoch_not_the_workers():
    decode = ft.ImageDecode(16, where="cpu")
    got = []
    for workers in (0, 3):
        with ft.Loader(Files(), batch_size=5, workers=workers, seed=3, decode=decode, device="host") as L:
            got.append(torch.cat([x for x, _ in L]))
            got.append(torch.cat([x for x, _ in L]))  # epoch 1: other crops
    assert torch.equal(got[0], got[2]) and torch.equal(got[1], got[3])
    assert not torch.equal(got[0], got[1])


@pytest.mark.parametrize("kind,image", [("dict", "jpeg"), ("alone", None)])
def test_the_image_may_be_a_dict_value_or_the_whole_sample(kind, image):
    decode = ft.ImageDecode(20, crop="center", mean=None, std=None, image=image, where="auto")
    assert decode.dtype == torch.uint8 and not decode.flip
    with ft.Loader(Files(kind=kind), batch_size=6, workers=1, decode=decode, device="host") as L:
        if kind == "dict":
            n = _check(L, decode, 0, lambda b: (b["jpeg"], [int(i) for i in b["label"]]))
        else:  # uint8 pixels are views of the device slots: cloned to be kept
            x = torch.cat([b.clone() for b in L])
            for i in range(len(IMAGES)):
                assert torch.equal(x[i], decode.reference(IMAGES[i], ft.sample_seed(0, 0, i)))
            n = x.shape[0]
    assert n == len(IMAGES)


def test_bfloat16_output():
    decode = ft.ImageDecode(16, dtype=torch.bfloat16, where="cpu")
    with ft.Loader(Files(), batch_size=13, workers=0, decode=decode, device="host") as L:
        x, idx = next(iter(L))
    assert x.dtype == torch.bfloat16
    ref = decode.reference(IMAGES[0], ft.sample_seed(0, 0, 0)).float()
    assert (_unnormalised(x[0].float(), decode) - ref).abs().max() < 2.5  # bfloat16's 8 bits of mantissa


def test_a_sample_that_is_not_a_jpeg_is_refused_by_index():
    images = list(IMAGES[:6])
    images[4] = b"\x89PNG\r\n\x1a\n" + bytes(64)
    decode = ft.ImageDecode(16, where="cpu")
    with ft.Loader(Files(images), batch_size=3, workers=2, decode=decode, device="host") as L:
        it = iter(L)
        next(it)
        with pytest.raises(Exception) as e:
            next(it)
    text = str(e.value) + "".join(getattr(e.value, "__notes__", []))
    assert "4" in text and "JPEG" in text, text


def test_a_sample_without_bytes_where_the_image_is_is_refused():
    class Pixels(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(3, 8, 8), i

    with ft.Loader(Pixels(), batch_size=2, workers=0, decode=ft.ImageDecode(8, where="cpu"), device="host") as L:
        with pytest.raises(TypeError, match=r"sample\[0\] is a Tensor of float32 \[3, 8, 8\]; ImageDecode expects the encoded image"):
            next(iter(L))


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="size=0"):
        ft.ImageDecode(0)
    with pytest.raises(ValueError, match="crop='square'"):
        ft.ImageDecode(crop="square")
    with pytest.raises(ValueError, match="where='gpu'"):
        ft.ImageDecode(where="gpu")
    with pytest.raises(ValueError, match="scale="):
        ft.ImageDecode(scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="give both or neither"):
        ft.ImageDecode(mean=None)
    with pytest.raises(ValueError, match="uint8"):
        ft.ImageDecode(mean=None, std=None, dtype=torch.float32)
    with pytest.raises(TypeError, match="expected a ferry.torch.ImageDecode"):
        ft.Loader(Files(), batch_size=2, workers=0, decode="jpeg", device="host")
    with pytest.raises(ValueError, match="where='device'"):
        ft.Loader(Files(), batch_size=2, workers=0, decode=ft.ImageDecode(where="device"), device="host")


def test_a_batch_that_fails_after_it_was_taken_ends_the_epoch_and_the_next_is_in_step(monkeypatch):
    import ferry.torch._loader as loader_module
    right = loader_module.finish_images
    calls = {"n": 0}

    def fails_on_the_second(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ValueError("sample 7: nvJPEG could not decode its JPEG (stand-in)")
        return right(*args)

    monkeypatch.setattr(loader_module, "finish_images", fails_on_the_second)
    decode = ft.ImageDecode(16, where="cpu")
    with ft.Loader(Files(), batch_size=3, workers=2, decode=decode, device="host") as L:
        it = iter(L)
        next(it)
        with pytest.raises(ValueError, match="stand-in"):
            next(it)
        with pytest.raises(StopIteration):
            next(it)  # the epoch ended with the batch
        assert _check(L, decode, 1, lambda b: (b[0], [int(i) for i in b[1]])) == 13  # every sample, each with its own crop


def test_the_device_decodes_bytes_leaf_is_ragged_whatever_buffer_holds_them():
    from ferry.torch._decode import Encoded
    from ferry.torch._samples import TorchSamples
    fmt = TorchSamples(decode=ft.ImageDecode(16, where="device"))
    for data in (IMAGES[0], np.frombuffer(IMAGES[0], dtype=np.uint8), bytearray(IMAGES[0])):
        _, spec = fmt.spec((Encoded(data, (0, 0, 8, 8, 0)), 3))
        assert [(s.path, s.kind) for s in spec] == [("sample[0]", "ragged"), ("sample[0]#box", "fixed"),
                                                   ("sample[1]", "fixed")], spec
        assert spec[0].shape == (len(IMAGES[0]),) and spec[1].shape == (5,)
