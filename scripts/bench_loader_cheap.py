#!/usr/bin/env python3
"""Samples/s of ferry.torch.Loader beside torch's DataLoader at the same number of workers, for cheap
samples (128 bytes: 32 int32 token ids and an int label; `cheap` takes them from a table, `drawn` draws
them with torch.randint per sample) and for an image-sized one (`image`: uint8 3x224x224 and a label),
in one run, on ferry's host backend (no GPU: the batches are CPU tensors; the DataLoader runs without
pin_memory, which needs CUDA) or on a GPU (--device cuda: the DataLoader pins and copies).

Each level is one loader, made once (persistent workers); an epoch is run to warm it up, then --epochs
epochs are timed. Every batch is checked as it arrives: its labels are the indices in order and its
samples' bytes equal the dataset's table at them, so a wrong or reordered sample fails the run.
Levels alternate (A B, then B A) over --repeat rounds and the median is reported. CPU seconds per batch:
user + system of this process and of its worker processes over the timed epochs (/proc), split into
main and workers.

    python3 scripts/bench_loader_cheap.py                       # cheap, drawn and image samples, 1 and 2 workers
    python3 scripts/bench_loader_cheap.py --kinds cheap --workers 2 --repeat 5 --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

import ferry.torch as ft  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


class Tokens:
    """Sample i: 32 int32 token ids (a row of a table made once) and the label i: 128 bytes + 8."""

    def __init__(self, n):
        self.table = torch.randint(0, 1 << 30, (n, 32), dtype=torch.int32, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.table)

    def __getitem__(self, i):
        return self.table[i], i


class Drawn(Tokens):
    """Sample i: 32 int32 token ids drawn by torch.randint from a generator seeded with i (a table of the
    same draws checks them) and the label i: a cheap sample that costs its dataset a few microseconds."""

    def __init__(self, n):
        self.table = torch.stack([self[i][0] for i in range(n)])

    def __getitem__(self, i):
        g = torch.Generator()
        g.manual_seed(i)
        return torch.randint(0, 1 << 30, (32,), dtype=torch.int32, generator=g), i


class Images:
    """Sample i: a uint8 3x224x224 image (one of 16 made once, i % 16) and the label i."""

    def __init__(self, n):
        self.n = n
        self.table = torch.randint(0, 256, (16, 3, 224, 224), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.table[i % 16], i


KINDS = {"cheap": (Tokens, 256, 256 * 160), "drawn": (Drawn, 256, 256 * 80), "image": (Images, 64, 64 * 40)}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children():
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                out.append(int(d))
    return out


def cpu_now():
    kids = 0.0
    for pid in children():
        try:
            kids += cpu_seconds(pid)
        except OSError:
            pass
    return cpu_seconds(os.getpid()), kids


def make(level, ds, batch, workers, device):
    if level == "ferry":
        return ft.Loader(ds, batch_size=batch, workers=workers, device=device)
    return torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=True,
                                       pin_memory=device == "cuda")


def epoch(loader, ds, device, check=True):
    n = batches = 0
    for x, y in loader:
        if device == "cuda" and x.device.type != "cuda":
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if check:
            yc = y.cpu()
            want = torch.arange(n, n + len(yc))
            if not torch.equal(yc, want):
                raise SystemExit(f"wrong labels in batch {batches}: {yc[:4].tolist()}... want {want[:4].tolist()}...")
            if isinstance(ds, Images):  # sample by sample: no copy of the table's rows
                xc = x.cpu()
                if not all(torch.equal(xc[j], ds.table[i % 16]) for j, i in enumerate(yc.tolist())):
                    raise SystemExit(f"wrong bytes in batch {batches}")
            elif not torch.equal(x.cpu(), ds.table[yc]):
                raise SystemExit(f"wrong bytes in batch {batches}")
        n += len(y)
        batches += 1
    return n, batches


def run_level(level, kind, workers, epochs, device):
    cls, batch, n = KINDS[kind]
    ds = cls(n)
    loader = make(level, ds, batch, workers, device)
    try:
        epoch(loader, ds, device)  # warm-up (workers started, slots laid out, pages touched)
        main0, kids0 = cpu_now()
        t0 = time.perf_counter()
        samples = batches = 0
        for _ in range(epochs):
            s, b = epoch(loader, ds, device)
            samples += s
            batches += b
        seconds = time.perf_counter() - t0
        main1, kids1 = cpu_now()
    finally:
        if level == "ferry":
            loader.close()
        else:
            del loader
    return {"level": level, "kind": kind, "workers": workers, "batch": batch, "samples": samples,
            "batches": batches, "seconds": seconds, "samples_per_s": samples / seconds,
            "main_cpu_per_batch": (main1 - main0) / batches, "worker_cpu_per_batch": (kids1 - kids0) / batches,
            "checked_batches": batches}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default="cheap,drawn,image")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--levels", default="ferry,dataloader")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, device {a.device}; "
          f"kinds {a.kinds}, workers {a.workers}, {a.epochs} timed epochs, {a.repeat} rounds", flush=True)
    for kind in a.kinds.split(","):
        for workers in map(int, a.workers.split(",")):
            for r in range(a.repeat):
                levels = a.levels.split(",")
                for level in (levels if r % 2 == 0 else levels[::-1]):
                    row = run_level(level, kind, workers, a.epochs, a.device)
                    row["round"] = r
                    rows.append(row)
                    print(f"  {kind:5} w{workers} {level:10} round {r}: {row['samples_per_s']:9.0f} samples/s, "
                          f"CPU s/batch main {row['main_cpu_per_batch']:.5f} workers "
                          f"{row['worker_cpu_per_batch']:.5f} ({row['checked_batches']} batches checked)", flush=True)
    print("\nmedians: kind workers level samples/s [min-max] CPU s/batch main workers; Loader/DataLoader")
    for kind in a.kinds.split(","):
        for workers in map(int, a.workers.split(",")):
            med = {}
            for level in a.levels.split(","):
                rs = [r for r in rows if r["kind"] == kind and r["workers"] == workers and r["level"] == level]
                v = [r["samples_per_s"] for r in rs]
                med[level] = statistics.median(v)
                print(f"  {kind:5} w{workers} {level:10} {med[level]:9.0f} [{min(v):.0f}-{max(v):.0f}]  "
                      f"{statistics.median(r['main_cpu_per_batch'] for r in rs):.5f} "
                      f"{statistics.median(r['worker_cpu_per_batch'] for r in rs):.5f}")
            if "ferry" in med and "dataloader" in med:
                print(f"  {kind:5} w{workers} ratio      {med['ferry'] / med['dataloader']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
