"""Training input: a DataLoader feeding ResNet-18, with PyTorch's pinned loader, the reference
prefetcher, and ferry's Prefetcher side by side.

ResNet-18 (torchvision, random weights) trains with Adam on batches of 64 images of 3x512x512 float32
(201 MB per batch), made on the CPU on demand by a Dataset and batched by a DataLoader with 8 worker
processes. Levels, each run in this one process:

  ideal      one batch already on the GPU, reused every step: the ceiling
  pinned     DataLoader(pin_memory=True); each batch copied with .to(device, non_blocking=True)
  reference  DataLoader(pin_memory=True) + the reference prefetcher: batch N+1 copied on a side stream
             while batch N computes; the compute stream waits on it (record_stream keeps it alive)
  ferry      DataLoader() (no pinning) + ferry.torch.Prefetcher: ferry's threads stage each batch in
             its pinned slots and copy it to the GPU on its own stream
  ferry_loader  ferry.torch.Loader over the same Dataset with as many worker processes: each sample is
             written once, into a shared pinned slot that ferry copies to the GPU (no collate copy, no
             pin copy)
  loader     the DataLoader alone (no pinning, no GPU): the rate at which its workers make batches on
             the cores allowed, a ceiling for every level fed by it

Each level reports steps/s, its ratio to ideal and the CPU seconds per step of this process and its
children (the DataLoader's workers) over the timed steps. `--cpus 4` limits the process (and the
workers it starts) to 4 cores, as `taskset -c 0-3` would.

Every batch is checked on the device: each sample carries its index in its first pixel and its label is
index % classes; the device sums both per step, and the sums are compared with the expected ones after
the level (no host sync in the loop).

    python3 examples/pytorch/train_prefetch.py                     # every level, 16 cores if present
    python3 examples/pytorch/train_prefetch.py --cpus 4 --json out-4cpu.json
    python3 examples/pytorch/train_prefetch.py --dry-run           # tiny, on the CPU
"""
import argparse
import os
import sys

from cpu_limit import limit_cpus_early

if __name__ == "__main__":
    limit_cpus_early(sys.argv[1:])

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ladder_common as lc  # noqa: E402

LEVELS = {
    "ideal": "one batch already on the device, reused every step (the ceiling)",
    "loader": "the DataLoader alone, no training: how fast its workers make batches on these cores",
    "pinned": "DataLoader(pin_memory=True), .to(device, non_blocking=True) in the loop",
    "reference": "DataLoader(pin_memory=True) + the reference prefetcher (side stream, one batch ahead)",
    "ferry": "DataLoader() + ferry.torch.Prefetcher",
    "ferry_loader": "ferry.torch.Loader: the workers write samples into pinned slots (no collate, no pin copy)",
}


class RandomImages(torch.utils.data.Dataset):
    """Images of uniform noise made on demand; sample i carries i in its first pixel and has label
    i % classes, so the device can check which samples a batch holds.

    The noise comes from numpy's PCG64 generator seeded with the sample's index. torch.rand (a serial
    Mersenne Twister on the CPU) costs several times more per sample: with it the DataLoader alone
    could not keep up with ResNet-18 on an H100 even on 16 cores (docs/PERFORMANCE.md), so every level
    would measure the dataset rather than the path to the GPU."""

    def __init__(self, n, size, classes):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img = torch.from_numpy(np.random.default_rng(i).random((3, self.size, self.size), dtype=np.float32))
        img[0, 0, 0] = float(i)
        return img, i % self.classes


class TinyClassifier(torch.nn.Module):
    """A small stand-in for machines without torchvision."""

    def __init__(self, classes):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                        torch.nn.Linear(8, classes))

    def forward(self, x):
        return self.body(x)


def make_model(args, dev):
    if args.model == "tiny":
        model = TinyClassifier(args.classes)
    else:
        from torchvision.models import resnet18
        model = resnet18(weights=None, num_classes=args.classes)
    return model.train().to(dev.torch_device)


def make_loader(args, dev, pin):
    ds = RandomImages(args.total_steps * args.batch, args.size, args.classes)
    return torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=False, drop_last=True,
                                       num_workers=args.workers, pin_memory=pin and dev.is_cuda,
                                       prefetch_factor=args.prefetch_factor if args.workers else None)


def batches(name, args, dev):
    if name == "loader":
        yield from make_loader(args, dev, pin=False)
    elif name == "pinned":
        for x, y in make_loader(args, dev, pin=True):
            yield x.to(dev.torch_device, non_blocking=True), y.to(dev.torch_device, non_blocking=True)
    elif name == "reference":
        yield from lc.ReferencePrefetcher(make_loader(args, dev, pin=True), dev)
    elif name == "ferry":
        from ferry.torch import Prefetcher
        # device: --device cpu runs ferry on its emulated device, also on a machine whose torch sees a GPU.
        yield from Prefetcher(make_loader(args, dev, pin=False), depth=args.depth, workers=args.ferry_workers,
                              slots=args.slots, device=dev.torch_device)
    elif name == "ferry_loader":
        from ferry.torch import Loader
        ds = RandomImages(args.total_steps * args.batch, args.size, args.classes)
        with Loader(ds, batch_size=args.batch, workers=max(1, args.workers), drop_last=True, depth=args.depth,
                    device=dev.torch_device, start_method=args.loader_start_method) as loader:
            yield from loader
    else:
        raise ValueError(name)


def run_level(name, args, dev, model, opt):
    row = lc.Row(name, LEVELS[name])
    crit = torch.nn.CrossEntropyLoss()
    total = args.total_steps
    on = torch.device("cpu") if name == "loader" else dev.torch_device
    marks = torch.zeros(total, dtype=torch.float64, device=on)
    labels = torch.zeros(total, dtype=torch.int64, device=on)
    win = lc.Window()

    def train_step(i, x, y):
        marks[i] = x[:, 0, 0, 0].double().sum()
        labels[i] = y.sum()
        if name == "loader":
            return
        loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if name == "ideal":
        ds = RandomImages(args.batch, args.size, args.classes)
        x = torch.stack([ds[i][0] for i in range(args.batch)]).to(dev.torch_device)
        y = torch.tensor([ds[i][1] for i in range(args.batch)], device=dev.torch_device)
        for i in range(total):
            if i == args.warmup:
                dev.synchronize()
                win.begin()
            train_step(i, x, y)
        dev.synchronize()
        win.end()
    else:
        it = batches(name, args, dev)
        n = 0
        for i, (x, y) in enumerate(it):
            if i == args.warmup:
                dev.synchronize()
                win.begin()
            train_step(i, x, y)
            n += 1
        dev.synchronize()
        win.end()
        del it
        if n != total:
            raise RuntimeError(f"the loader gave {n} batches, expected {total}")
        b = args.batch
        want_marks = [float(sum(range(i * b, (i + 1) * b))) for i in range(total)]
        want_labels = [sum(j % args.classes for j in range(i * b, (i + 1) * b)) for i in range(total)]
        got_marks, got_labels = marks.cpu().tolist(), labels.cpu().tolist()
        row.checked = total
        row.mismatches = sum(1 for i in range(total)
                             if got_marks[i] != want_marks[i] or got_labels[i] != want_labels[i])
    row.set_window(args.steps, win)
    row.bytes_moved = 0 if name in ("ideal", "loader") else args.steps * args.batch * 3 * args.size * args.size * 4
    return row


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default=",".join(LEVELS), help="comma-separated, from: " + ",".join(LEVELS))
    p.add_argument("--steps", type=int, default=40, help="timed steps per level (default 40)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=512, help="image height and width (default 512)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--model", choices=["resnet18", "tiny"], default="resnet18")
    p.add_argument("--workers", type=int, default=8, help="DataLoader worker processes (default 8)")
    p.add_argument("--prefetch-factor", type=int, default=2, help="DataLoader prefetch_factor (default 2)")
    p.add_argument("--depth", type=int, default=2, help="ferry: device slots, batches copied ahead (default 2)")
    p.add_argument("--slots", type=int, default=2, help="ferry: pinned host slots (default 2)")
    p.add_argument("--ferry-workers", type=int, default=4, help="ferry: staging threads (default 4)")
    p.add_argument("--loader-start-method", choices=["fork", "forkserver", "spawn"],
                   help="ferry.torch.Loader's start_method (default: its own choice, fork only from a process of one "
                        "thread)")
    p.add_argument("--cpus", type=int, help="limit this process and its workers to the first N allowed cores")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout)")
    p.add_argument("--dry-run", action="store_true",
                   help="a tiny run on the CPU (defaults: --device cpu --model tiny --batch 2 --size 32 --steps 2 "
                        "--warmup 1 --workers 2 --classes 10)")
    if p.parse_args(argv).dry_run:  # new defaults; options given explicitly still win
        p.set_defaults(device="cpu", model="tiny", batch=2, size=32, steps=2, warmup=1, workers=2, classes=10)
    a = p.parse_args(argv)
    for name in ("steps", "batch", "size", "classes", "prefetch_factor", "depth", "slots", "ferry_workers"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be at least 1")
    if a.warmup < 1:
        p.error(f"--warmup {a.warmup}: must be at least 1")
    if a.workers < 0:
        p.error(f"--workers {a.workers}: must be at least 0")
    a.total_steps = a.warmup + a.steps
    a.level_list = lc.parse_levels(a.levels, LEVELS)
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.cpus and __name__ != "__main__":
        limit_cpus_early([f"--cpus={args.cpus}"])
    dev = lc.Device(args.device)
    torch.manual_seed(0)
    if dev.is_cuda:
        torch.backends.cudnn.benchmark = True
    model = make_model(args, dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    rows = lc.run_levels(LEVELS, args.level_list, lambda name: run_level(name, args, dev, model, opt))
    lc.print_table(rows, [
        ("level", 10, lambda r, i: r.name),
        ("steps/s", 8, lambda r, i: f"{r.steps_per_s:.2f}"),
        ("x ideal", 7, lc.ratio),
        ("H2D GB/s", 8, lambda r, i: f"{r.bytes_moved / r.seconds / 1e9:.2f}" if r.bytes_moved else "-"),
        ("CPU s/step", 10, lambda r, i: f"{r.cpu_seconds / r.steps:.3f}"),
        ("main", 6, lambda r, i: f"{r.cpu_parts[0] / r.steps:.3f}"),
        ("threads", 7, lambda r, i: f"{r.cpu_parts[1] / r.steps:.3f}"),
        ("workers", 7, lambda r, i: f"{r.cpu_parts[2] / r.steps:.3f}"),
        ("checked", 7, lambda r, i: f"{r.checked}" if r.name != "ideal" else "-"),
        ("wrong", 5, lambda r, i: f"{r.mismatches}"),
    ], f"train prefetch: {args.model}, Adam, batch {args.batch}x3x{args.size}x{args.size}, "
       f"{args.workers} loader workers, {len(os.sched_getaffinity(0))} cores allowed, {args.steps} timed "
       f"steps, {dev.description()}")
    if args.json:
        lc.write_json(args.json, dev, args, rows)
    return lc.exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
