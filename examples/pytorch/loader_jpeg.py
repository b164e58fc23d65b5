"""Training input from JPEG files: torch's DataLoader and ferry.torch.Loader side by side on ResNet-50.

The input pipeline people run for ImageNet-style training: JPEG files on local disk, decoded with PIL in
worker processes, randomly resized, cropped (scale 0.08-1, ratio 3/4-4/3, as torchvision's
RandomResizedCrop) and flipped to 224x224, uint8 CHW into the batch, normalised on the GPU. ResNet-50
(torchvision, random weights) trains with SGD in channels_last under bf16 autocast, so the GPU is fast
and the input path is what limits. The JPEGs (--images, 500x375 to 640x480, quality 90) are made with
PIL at the start in --data (a temporary directory by default); sample i is file i % images with label
(i % images) % classes, and its crop and flip are drawn from a generator seeded with i, so every level
feeds the same bytes and each can be checked.

Levels, each for every --workers count:

  ideal          one batch resident on the GPU, reused every step: the ceiling
  dataloader     DataLoader(num_workers=N, pin_memory=True, persistent_workers=True) + the reference
                 side-stream prefetcher (batch k+1 copied on a side stream while batch k computes)
  dl_prefetcher  DataLoader(num_workers=N, persistent_workers=True), no pinning, + ferry.torch.Prefetcher
  ferry_loader   ferry.torch.Loader(workers=N): each sample written once into a shared pinned slot that
                 ferry copies to the GPU (no collate copy, no pin copy)
  ferry_cpu_decode   ferry.torch.Loader(decode=ImageDecode(where="cpu")): the dataset returns the file's
                 bytes; the workers decode only the crop region with libjpeg-turbo (DCT-scaled) into the slot
  ferry_gpu_decode   ferry.torch.Loader(decode=ImageDecode(where="device")): the workers copy the compressed
                 bytes into the slot; nvJPEG decodes the batch on the GPU, one kernel crops, resizes, flips and
                 normalises it

Each row: steps/s, its ratio to ideal, the batches the workers made per second of the window (made/s: a
DataLoader holds up to prefetch_factor x N batches made before the window and can hand them out in it,
so its steps/s over a short window overstates what it sustains; the --repeat summary compares the
sustained rate, the lower of the two), CPU seconds per batch of the main thread, the main process's other
threads and the worker processes. The two host copies a DataLoader makes per batch, the collate into
fresh shared memory and the pin thread's copy, are timed alone on one batch (the `copies` line). Every
step's batch is checked on the device: the sum of its bytes and of its labels against the sums the
main process computed from the same samples (no host sync in the loop). The decode levels draw their crops
from ferry's generator (ImageDecode: the sample's seed), not the dataset's, so their bytes differ from the
others': their labels are checked the same way, and one image of every batch (position step % batch) is
kept and compared after the window, every pixel, with ImageDecode.reference (the CPU decode of the same
box): the cpu level exactly, the device level within the stated tolerance.

    python3 examples/pytorch/loader_jpeg.py --workers 4,8,14            # on a GPU machine
    python3 examples/pytorch/loader_jpeg.py --workers 4,8 --cpus 8 --json out.json
    python3 examples/pytorch/loader_jpeg.py --workers 4,auto            # ferry's levels: Loader(workers="auto")
    python3 examples/pytorch/loader_jpeg.py --dry-run                   # tiny, on the CPU
"""
import argparse
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

from cpu_limit import limit_cpus_early

if __name__ == "__main__":
    limit_cpus_early(sys.argv[1:])

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import ladder_common as lc  # noqa: E402

LEVELS = {
    "ideal": "one batch resident on the device, reused every step (the ceiling)",
    "dataloader": "DataLoader(pin_memory=True, persistent_workers=True) + the reference side-stream prefetcher",
    "dl_prefetcher": "DataLoader(persistent_workers=True) + ferry.torch.Prefetcher",
    "ferry_loader": "ferry.torch.Loader: samples written once into shared pinned slots",
    "ferry_cpu_decode": "ferry.torch.Loader(decode=ImageDecode(where='cpu')): libjpeg-turbo crop-region decode "
                        "in the workers",
    "ferry_gpu_decode": "ferry.torch.Loader(decode=ImageDecode(where='device')): JPEG bytes shipped, nvJPEG "
                        "decode and crop on the GPU",
}
DECODE_LEVELS = {"ferry_cpu_decode": "cpu", "ferry_gpu_decode": "device"}
AUTO = -1  # --workers auto
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


# ---- the files -------------------------------------------------------------------------------------

def picture(i, w, h):
    """Image i, uint8 h x w x 3: smooth colour gradients with noise, so that it compresses as photos do (~80
    KB at q90 for 500x375..640x480). scripts/bench_jpeg_cpu.py and tests/python/test_image.py make theirs
    with it too."""
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, phase = rng.uniform(0.002, 0.03, 2).tolist() + [rng.uniform(0, 6.3)]
        img[..., c] = 127 + 80 * np.sin(x * fx + y * fy + phase)
    img += rng.normal(0, 12, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _make_jpeg(job):
    """Writes image i (picture())."""
    path, i, w, h = job
    tmp = f"{path}.partial"
    Image.fromarray(picture(i, w, h)).save(tmp, "JPEG", quality=90)
    os.replace(tmp, path)  # complete files only under their names


def _one_thread():
    """A pool process computes with one thread, as a DataLoader's workers do (torch.set_num_threads(1)):
    one intra-op pool per process, each as wide as the machine, would oversubscribe the cores."""
    torch.set_num_threads(1)


def make_files(directory, images, workers):
    """The JPEG paths, made where missing (sizes 500x375 to 640x480, drawn per image)."""
    import multiprocessing
    paths, jobs = [], []
    for i in range(images):
        rng = np.random.default_rng(10_000 + i)
        w = int(rng.integers(500, 641))
        h = int(rng.integers(375, 481))
        p = os.path.join(directory, f"img_{i:06d}.jpg")
        paths.append(p)
        if not os.path.exists(p):
            jobs.append((p, i, w, h))
    if jobs:
        with multiprocessing.get_context("fork").Pool(max(1, workers), initializer=_one_thread) as pool:
            pool.map(_make_jpeg, jobs, chunksize=16)
    return paths


# ---- the dataset -------------------------------------------------------------------------------------

def crop_params(width, height, g, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params with an explicit generator: (top, left, h, w)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(scale[0], scale[1], generator=g).item()
        aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=g).item())
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=g).item())
            left = int(torch.randint(0, width - w + 1, (1,), generator=g).item())
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


_METER_SLOTS = 64  # worker ids metered; a worker with a larger id is not metered


def _worker_id():
    """The id of the loader worker this runs in (a DataLoader's or a ferry Loader's), or None."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        return info.id
    from ferry.torch import worker_info
    info = worker_info()
    return info.id if info is not None else None


class JpegFolder(torch.utils.data.Dataset):
    """Sample i: file i % len(paths) decoded (PIL, as torchvision's default_loader), resized crop and
    flip drawn from a generator seeded with i, as uint8 CHW (a permuted view of a copy of the pixels, as
    torchvision's PILToTensor returns), and its label.

    `meter`, shared memory made before the workers start, adds up per worker id the CPU seconds, wall
    seconds and count of the samples made in loader workers: the dataset's own cost, whichever loader
    runs it, apart from what the loader adds around it (collate, the write into a slot, messages)."""

    def __init__(self, paths, length, size, classes):
        self.paths, self.length, self.size, self.classes = paths, length, size, classes
        self.meter = None

    def __len__(self):
        return self.length

    def bytes_view(self):
        """The same files as JpegBytes (undecoded), sharing this dataset's meter."""
        view = JpegBytes(self.paths, self.length, self.size, self.classes)
        view.meter = self.meter
        return view

    def __getitem__(self, i):
        if self.meter is None:
            return self._make(i)
        wid = _worker_id()
        if wid is None or wid >= _METER_SLOTS:
            return self._make(i)
        c0, t0 = time.process_time(), time.perf_counter()
        sample = self._make(i)
        m = self.meter
        m[3 * wid] += time.process_time() - c0
        m[3 * wid + 1] += time.perf_counter() - t0
        m[3 * wid + 2] += 1
        return sample

    def _make(self, i):
        f = i % len(self.paths)
        with open(self.paths[f], "rb") as fh:
            img = Image.open(fh).convert("RGB")
        g = torch.Generator().manual_seed(i)
        top, left, h, w = crop_params(img.width, img.height, g)
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + w, top + h))
        if torch.rand(1, generator=g).item() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img)).permute(2, 0, 1), f % self.classes  # as PILToTensor


class JpegBytes(JpegFolder):
    """Sample i: file i % len(paths) as it is on disk (its bytes, read and not decoded) and its label: an
    ImageFolder without the decode, for ferry.torch.Loader(decode=ImageDecode(...))."""

    def _make(self, i):
        f = i % len(self.paths)
        with open(self.paths[f], "rb") as fh:
            return fh.read(), f % self.classes


def _sample_sums(job):
    ds, indices = job
    return [(int(ds[i][0].sum(dtype=torch.int64)), ds[i][1]) for i in indices]


def expected_sums(ds, steps, batch, workers):
    """Per step: (sum of the batch's bytes, sum of its labels), from the samples themselves."""
    import multiprocessing
    per = [list(range(s * batch, (s + 1) * batch)) for s in range(steps)]
    with multiprocessing.get_context("fork").Pool(max(1, workers), initializer=_one_thread) as pool:
        done = pool.map(_sample_sums, [(ds, idx) for idx in per])
    return [(sum(a for a, _ in d), sum(b for _, b in d)) for d in done]


# ---- levels -------------------------------------------------------------------------------------------


def batches(name, ds, workers, args, dev, info):
    if name in ("dataloader", "dl_prefetcher"):
        pin = name == "dataloader" and dev.is_cuda
        loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=False, drop_last=True,
                                             num_workers=workers, pin_memory=pin, persistent_workers=True,
                                             prefetch_factor=args.prefetch_factor)
        if name == "dataloader":
            yield from lc.ReferencePrefetcher(loader, dev)
        else:
            from ferry.torch import Prefetcher
            with Prefetcher(loader, depth=args.depth, device=dev.torch_device) as p:
                yield from p
    elif name in DECODE_LEVELS:
        from ferry.torch import ImageDecode, Loader
        decode = ImageDecode(args.size, where=DECODE_LEVELS[name], channels_last=True)
        info["decode"] = decode
        with Loader(ds.bytes_view(), batch_size=args.batch, workers=workers, drop_last=True, depth=args.depth,
                    device=dev.torch_device, start_method=args.loader_start_method, decode=decode) as loader:
            try:
                yield from loader
            finally:
                info.update(loader.stats(), start_method=loader.start_method)
    elif name == "ferry_loader":
        from ferry.torch import Loader
        with Loader(ds, batch_size=args.batch, workers=workers, drop_last=True, depth=args.depth,
                    device=dev.torch_device, start_method=args.loader_start_method) as loader:
            try:
                yield from loader
            finally:
                info.update(loader.stats(), start_method=loader.start_method)
    else:
        raise ValueError(name)


def make_model(args, dev):
    if args.model == "tiny":
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(8, args.classes))
    else:
        from torchvision.models import resnet50
        model = resnet50(weights=None, num_classes=args.classes)
    return model.train().to(dev.torch_device, memory_format=torch.channels_last)


def _whole_rounds(steps, workers):
    return -(-steps // workers) * workers if workers else steps


def warmup_steps(args, workers):
    """Untimed steps at N workers: --warmup plus what the loaders can hold made ahead (a DataLoader's
    prefetch_factor x N batches, ferry's device slots), so that a loader slower than the GPU has spent its
    head start before the window opens and the window times the batches made in it; a multiple of N."""
    return _whole_rounds(args.warmup + (args.prefetch_factor * workers + args.depth if workers else 0), workers)


def timed_steps(args, workers):
    """Timed steps at N workers: --steps rounded up to a multiple of N. A DataLoader's N workers each make
    whole batches, so its batches come in rounds of N; a window of whole rounds, from one round's first
    batch to a later round's first batch, times them without the round's quantum as error."""
    return _whole_rounds(args.steps, workers)


def _meter_sums(meter):
    """(CPU seconds, wall seconds, samples) that the workers spent in the dataset so far."""
    m = list(meter)
    return sum(m[0::3]), sum(m[1::3]), sum(m[2::3])


def run_level(label, name, workers, auto, args, dev, ds, expected):
    row = lc.Row(label, LEVELS[name])
    torch.manual_seed(0)
    model = make_model(args, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    crit = torch.nn.CrossEntropyLoss()
    mean = torch.tensor(MEAN, device=dev.torch_device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=dev.torch_device).view(1, 3, 1, 1) * 255
    warmup, steps = warmup_steps(args, workers), timed_steps(args, workers)
    total = warmup + steps
    sums = torch.zeros(total, dtype=torch.int64, device=dev.torch_device)
    labels = torch.zeros(total, dtype=torch.int64, device=dev.torch_device)
    amp = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev.is_cuda else torch.autocast(
        device_type="cpu", dtype=torch.bfloat16, enabled=False)
    win = lc.Window()

    decoded = name in DECODE_LEVELS
    kept = torch.empty((total, 3, args.size, args.size), device=dev.torch_device) if decoded else None

    def step(i, x, y):
        labels[i] = y.sum()
        if decoded:  # normalised, channels_last already: one image kept for the check after the window
            kept[i].copy_(x[i % args.batch])
        else:
            sums[i] = x.sum(dtype=torch.int64)
            x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with amp:
            loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if name == "ideal":
        x = torch.stack([ds[i][0] for i in range(args.batch)]).to(dev.torch_device)
        y = torch.tensor([ds[i][1] for i in range(args.batch)], device=dev.torch_device)
        for i in range(total):
            if i == warmup:
                dev.synchronize()
                win.begin()
            step(i, x, y)
        dev.synchronize()
        win.end()
    else:
        n = 0
        info = {}
        ds.meter = multiprocessing.RawArray("d", 3 * _METER_SLOTS)  # before the workers start
        meter0 = None
        it = batches(name, ds, "auto" if auto else workers, args, dev, info)
        start = time.perf_counter()
        for i, (x, y) in enumerate(it):
            if i == 0:
                dev.synchronize()
                row.extra["first_batch_seconds"] = time.perf_counter() - start
            if i == warmup:
                dev.synchronize()
                meter0 = _meter_sums(ds.meter)
                win.begin()
            if i == total:  # the window ends as batch `total` arrives (and the GPU is done): unused
                break
            step(i, x, y)
            n += 1
        dev.synchronize()
        win.end()
        meter1 = _meter_sums(ds.meter)
        it.close()
        ds.meter = None
        decode = info.pop("decode", None)  # the decode levels' ImageDecode (not a statistic)
        made = meter1[2] - meter0[2] if meter0 is not None else 0
        if meter0 is not None and workers <= _METER_SLOTS:
            row.extra["samples_in_window"] = made  # 0 too: every batch of the window was made before it
        if made > 0 and workers <= _METER_SLOTS:
            # Per sample made in the window: the dataset's CPU and wall time, and the workers' CPU outside
            # it (the loader's part: collate or the write into a slot, messages, page faults).
            row.extra["dataset_cpu_ms"] = (meter1[0] - meter0[0]) / made * 1e3
            row.extra["dataset_wall_ms"] = (meter1[1] - meter0[1]) / made * 1e3
            row.extra["outside_cpu_ms"] = (win.parts[2] - (meter1[0] - meter0[0])) / made * 1e3
        if info:
            busy = sum(w["seconds"] for w in info["workers"])
            row.extra["loader_stats"] = info
            row.extra["worker_busy"] = busy / (workers * (time.perf_counter() - start))
            made = sum(w["samples"] for w in info["workers"]) / args.batch
            # the workers' time in writing samples into the slots, per batch (the rest: the dataset)
            row.extra["write_seconds_per_batch"] = sum(w["write_seconds"] for w in info["workers"]) / made
        if n != total:
            raise RuntimeError(f"the loader gave {n} batches, expected {total}")
        got_sums, got_labels = sums.cpu().tolist(), labels.cpu().tolist()
        row.checked = total
        if decoded:
            row.mismatches = sum(1 for i in range(total) if got_labels[i] != expected[i][1])
            row.mismatches += check_decoded(kept, decode, ds, args, row)
        else:
            row.mismatches = sum(1 for i in range(total) if (got_sums[i], got_labels[i]) != expected[i])
    row.set_window(steps, win)
    row.extra["workers"] = workers if name != "ideal" else 0
    if auto:  # what Loader(workers="auto") chose: the workers that got chunks at the end, and its history
        row.extra["workers_active"] = info["autoscale"]["active"]
        row.extra["autoscale_history"] = [h["active"] for h in info["autoscale"]["history"]]
    row.bytes_moved = 0 if name == "ideal" else steps * args.batch * 3 * args.size * args.size
    return row


def check_decoded(kept, decode, ds, args, row):
    """The batches whose kept image (batch i's sample i % batch) differs from ImageDecode.reference, the CPU
    decode of the same crop, past the tolerance (cpu level: exact, but for the normalisation's rounding;
    device: decode.tolerance, the mean and the 99th percentile in 8-bit levels); the largest differences go
    into the row."""
    from ferry.torch import sample_seed
    views = ds.bytes_view()
    worst_max, worst_mean, worst_p99, wrong = 0.0, 0.0, 0.0, 0
    centre = torch.tensor(decode.mean).view(3, 1, 1)
    spread = torch.tensor(decode.std).view(3, 1, 1)
    exact = decode.where == "cpu"
    for i in range(kept.shape[0]):
        index = i * args.batch + i % args.batch
        ref = decode.reference(views[index][0], sample_seed(0, 0, index)).float()
        got = (kept[i].cpu() * spread + centre) * 255  # back to 8-bit levels
        diff = (got - ref).abs()
        big, mean, p99 = float(diff.max()), float(diff.mean()), float(torch.quantile(diff.flatten(), 0.99))
        worst_max, worst_mean, worst_p99 = max(worst_max, big), max(worst_mean, mean), max(worst_p99, p99)
        if exact:  # the same bytes; the normalisation and its inverse round in float32
            wrong += big > 0.01
        else:
            wrong += mean > decode.tolerance[0] or p99 > decode.tolerance[1]
    row.extra.update(pixel_max_diff=worst_max, pixel_mean_diff=worst_mean, pixel_p99_diff=worst_p99)
    return wrong


def time_copies(ds, args, dev):
    """The DataLoader's two host copies of one batch, alone: default_collate's stack into fresh shared
    memory (as in a worker) and pin_memory()'s copy into pinned memory (as its pin thread), best of 5."""
    samples = [ds[i] for i in range(args.batch)]
    collate, pin = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        batch = torch.utils.data.default_collate(samples)
        storage = torch.empty_like(batch[0]).share_memory_()
        storage.copy_(batch[0])  # default_collate in a worker stacks straight into fresh shared memory
        t1 = time.perf_counter()
        if dev.is_cuda:
            storage.pin_memory()
        t2 = time.perf_counter()
        collate.append(t1 - t0)
        pin.append(t2 - t1)
        del batch, storage
    return {"collate_seconds": min(collate), "pin_seconds": min(pin) if dev.is_cuda else None,
            "batch_bytes": args.batch * 3 * args.size * args.size}


def _median_of(rows, key):
    v = [r.extra[key] for r in rows if key in r.extra]
    return statistics.median(v) if v else None


def _text(v, fmt):
    return "-" if v is None else format(v, fmt)


def made_per_s(r, args):
    """Batches the loader's workers made per second of the window (samples made in it / batch): what the
    loader sustains. A loader that holds batches made before the window (a DataLoader holds up to
    prefetch_factor x N) can hand out more than it makes in a short window; the consumed rate (steps/s)
    then overstates it."""
    made = r.extra.get("samples_in_window")
    if made is None or not r.steps or not r.steps_per_s:
        return None
    return made / args.batch / (r.steps / r.steps_per_s)


def sustained(r, args):
    """The steps/s the loader sustains: the consumed rate, or the made rate where that is lower (the window
    drew on batches made before it)."""
    m = made_per_s(r, args)
    return r.steps_per_s if m is None else min(r.steps_per_s, m)


def repeat_summary(rows, args):
    """With --repeat: per level and N, the median steps/s and its range over the repeats, with the median
    per-sample dataset and outside CPU; printed as a table, returned for the JSON."""
    ideal = next((r for r in rows if r.name == "ideal" and r.error is None), None)
    groups = {}
    for r in rows:
        if r.name != "ideal" and r.error is None:
            groups.setdefault(r.name.split("#")[0], []).append(r)
    out = []
    print(f"over {args.repeat} repeats (the order of the levels rotated): median [min-max]; sustained: the "
          "lower of steps/s and the batches made per second of the window")
    print(f"{'level':16}  {'steps/s':>20}  {'sustained':>20}  {'x ideal':>7}  {'ds ms':>6}  {'out ms':>6}  "
          f"{'write ms':>8}   (x ideal: of the sustained rate)")
    for label, rs in groups.items():
        sps = [r.steps_per_s for r in rs]
        sus = [sustained(r, args) for r in rs]
        write = _median_of(rs, "write_seconds_per_batch")
        item = {"level": label, "runs": len(rs), "steps_per_s": sps, "median_steps_per_s": statistics.median(sps),
                "sustained_steps_per_s": sus, "median_sustained_steps_per_s": statistics.median(sus),
                "of_ideal": statistics.median(sps) / ideal.steps_per_s if ideal else None,
                "sustained_of_ideal": statistics.median(sus) / ideal.steps_per_s if ideal else None,
                "dataset_cpu_ms": _median_of(rs, "dataset_cpu_ms"), "outside_cpu_ms": _median_of(rs, "outside_cpu_ms"),
                "write_ms_per_batch": None if write is None else write * 1e3}
        out.append(item)
        spread = f"{item['median_steps_per_s']:.2f} [{min(sps):.2f}-{max(sps):.2f}]"
        spread_sus = f"{item['median_sustained_steps_per_s']:.2f} [{min(sus):.2f}-{max(sus):.2f}]"
        print(f"{label:16}  {spread:>20}  {spread_sus:>20}  {_text(item['sustained_of_ideal'], '.2f'):>7}  "
              f"{_text(item['dataset_cpu_ms'], '.2f'):>6}  {_text(item['outside_cpu_ms'], '.2f'):>6}  "
              f"{_text(item['write_ms_per_batch'], '.1f'):>8}")
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", help="comma-separated, from: " + ",".join(LEVELS) + " (default: all; without a "
                   "GPU all but ferry_gpu_decode)")
    p.add_argument("--workers", default="4,8,14", help="worker process counts, comma-separated (default 4,8,14)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per level (default 30)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps before them (default 5), plus prefetch_factor x N + depth at N workers")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224, help="crop size (default 224)")
    p.add_argument("--images", type=int, default=4000, help="JPEG files to make and read (default 4000)")
    p.add_argument("--data", help="directory of the JPEGs (made where missing; default: a temporary one)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--model", choices=["resnet50", "tiny"], default="resnet50")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each level at each N this many times, the order of the levels rotated each time, "
                        "and print the median and range of each (default 1)")
    p.add_argument("--prefetch-factor", type=int, default=2, help="DataLoader prefetch_factor (default 2)")
    p.add_argument("--depth", type=int, default=2, help="ferry: device slots (default 2)")
    p.add_argument("--loader-start-method", choices=["fork", "forkserver", "spawn"],
                   help="ferry.torch.Loader's start_method (default: its own choice, fork only from a process of one "
                        "thread)")
    p.add_argument("--cpus", type=int, help="limit this process and its workers to the first N allowed cores")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout)")
    p.add_argument("--dry-run", action="store_true",
                   help="a tiny run on the CPU (defaults: --device cpu --model tiny --batch 4 --size 32 --steps 2 "
                        "--warmup 1 --workers 2 --images 6 --classes 10)")
    if p.parse_args(argv).dry_run:
        p.set_defaults(device="cpu", model="tiny", batch=4, size=32, steps=2, warmup=1, workers="2", images=6,
                       classes=10)
    a = p.parse_args(argv)
    if a.levels is None:
        a.levels = ",".join(n for n in LEVELS if a.device == "cuda" or n != "ferry_gpu_decode")
    for name in ("steps", "warmup", "batch", "size", "images", "classes", "prefetch_factor", "depth", "repeat"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be at least 1")
    try:  # "auto": ferry's levels with Loader(workers="auto"); the DataLoader's are not run there
        a.worker_counts = [AUTO if w.strip() == "auto" else int(w) for w in a.workers.split(",") if w.strip()]
    except ValueError:
        p.error(f"--workers {a.workers!r}: expected comma-separated counts such as 4,8,14 (or auto)")
    if not a.worker_counts or any(w != AUTO and w < 1 for w in a.worker_counts):
        p.error(f"--workers {a.workers!r}: every count must be at least 1")
    a.level_list = lc.parse_levels(a.levels, LEVELS)
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.cpus and __name__ != "__main__":
        limit_cpus_early([f"--cpus={args.cpus}"])
    dev = lc.Device(args.device)
    if dev.is_cuda:
        torch.backends.cudnn.benchmark = True
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="ferry-jpeg-") as tmp:
        directory = args.data or tmp
        os.makedirs(directory, exist_ok=True)
        t0 = time.perf_counter()
        paths = make_files(directory, args.images, cores)
        auto_count = max(1, cores - 1)  # what Loader(workers="auto") starts
        counts = [auto_count if w == AUTO else w for w in args.worker_counts]
        total = max(warmup_steps(args, w) + timed_steps(args, w) for w in counts)
        ds = JpegFolder(paths, (total + 1) * args.batch, args.size, args.classes)  # + the window's end
        expected = expected_sums(ds, total, args.batch, cores)
        print(f"[{time.strftime('%H:%M:%S')}] {len(paths)} JPEGs in {directory}, reference sums of {total} "
              f"batches in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        copies = time_copies(ds, args, dev)
        runs = {name: (name, 0, False) for name in args.level_list if name == "ideal"}
        others = [name for name in args.level_list if name != "ideal"]
        for w in args.worker_counts:
            mine = [n for n in others if w != AUTO or n.startswith("ferry")]
            for r in range(args.repeat):
                # Rotated each time, so that no level always runs first (or right after another)
                for name in mine[r % len(mine):] + mine[:r % len(mine)] if mine else []:
                    runs[f"{name}/{'auto' if w == AUTO else w}" + (f"#{r + 1}" if args.repeat > 1 else "")] = (
                        name, auto_count if w == AUTO else w, w == AUTO)
        names = {label: LEVELS[n] for label, (n, *_) in runs.items()}
        rows = lc.run_levels(names, list(names), lambda label: run_level(label, *runs[label], args, dev, ds, expected))
    lc.print_table(rows, [
        ("level", 20, lambda r, i: r.name),
        ("steps/s", 8, lambda r, i: f"{r.steps_per_s:.2f}"),
        ("x ideal", 7, lc.ratio),
        ("made/s", 6, lambda r, i: _text(made_per_s(r, args), ".2f")),
        ("img/s", 7, lambda r, i: f"{r.steps_per_s * args.batch:.0f}"),
        ("CPU s/batch", 11, lambda r, i: f"{r.cpu_seconds / r.steps:.3f}"),
        ("main", 6, lambda r, i: f"{r.cpu_parts[0] / r.steps:.3f}"),
        ("threads", 7, lambda r, i: f"{r.cpu_parts[1] / r.steps:.3f}"),
        ("workers", 7, lambda r, i: f"{r.cpu_parts[2] / r.steps:.3f}"),
        ("1st batch s", 11, lambda r, i: f"{r.extra.get('first_batch_seconds', 0):.2f}" if r.name != "ideal" else "-"),
        ("start", 10, lambda r, i: r.extra.get("loader_stats", {}).get("start_method", "-")),
        ("write ms", 8, lambda r, i: f"{r.extra['write_seconds_per_batch'] * 1e3:.1f}"
         if "write_seconds_per_batch" in r.extra else "-"),
        ("ds ms", 6, lambda r, i: f"{r.extra['dataset_cpu_ms']:.2f}" if "dataset_cpu_ms" in r.extra else "-"),
        ("out ms", 6, lambda r, i: f"{r.extra['outside_cpu_ms']:.2f}" if "outside_cpu_ms" in r.extra else "-"),
        ("busy", 5, lambda r, i: f"{r.extra['worker_busy']:.2f}" if "worker_busy" in r.extra else "-"),
        ("active", 6, lambda r, i: f"{r.extra['workers_active']}" if "workers_active" in r.extra else "-"),
        ("checked", 7, lambda r, i: f"{r.checked}" if r.name != "ideal" else "-"),
        ("wrong", 5, lambda r, i: f"{r.mismatches}"),
    ], f"JPEG training input: {args.model}, SGD, bf16 autocast, channels_last, batch {args.batch}x3x{args.size}^2 "
       f"uint8, {args.images} JPEGs, {cores} cores allowed, {args.steps}+ timed steps (whole rounds of N), "
       f"{dev.description()}")
    summary = repeat_summary(rows, args) if args.repeat > 1 else []
    pin = f"{copies['pin_seconds'] * 1e3:.1f} ms" if copies["pin_seconds"] is not None else "- (no GPU)"
    print(f"copies: one batch of {copies['batch_bytes'] / 1e6:.1f} MB: collate into fresh shared memory "
          f"{copies['collate_seconds'] * 1e3:.1f} ms, pin_memory() {pin} (what ferry.torch.Loader does not do)")
    if args.json:
        lc.write_json(args.json, dev, args, rows, extra={"copies": copies, "repeat_summary": summary})
    return lc.exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
