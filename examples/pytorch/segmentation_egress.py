"""Batched segmentation inference with large outputs: the device-to-host reference ladder beside ferry.

torchvision's DeepLabV3-ResNet50 (random weights) segments batches of 64 images of 3x512x512 into 21
classes: 64x21x512x512 float32 logits, 1.41 GB of output per step, every step copied to the host and
written to /dev/null. Inputs come from a prefetched loader (a few pinned batches, each step's copied on
a side stream one step ahead), the same for every level. Levels, each run in this one process:

  ideal             the model steps with no output copy: the ceiling
  L0                blocking copy into a fresh CPU tensor; processing inline
  L1                as L0, the fresh tensors handed to N worker processes through a queue
  L2                a shared pool of whole-output host buffers behind a free list; blocking copy
  L3                non-blocking copy on the compute stream + event + a monitor thread that waits on it
                    before handing the buffer to a worker
  L4                L3 with the copy on an egress stream that waits on the compute stream
  L4-pinned         L4 with the shared pool really pinned (cudaHostRegister)
  L4-pinned-nocopy  L4-pinned whose workers write from a zero-copy view (no bytes object per output)
  ferry             ferry.torch.Egress, its sink writing each output's bytes to /dev/null

The reference levels (L0..L4) are the hand-written pipeline as the field writes it: the pool is
`torch.empty(..., pin_memory=True).share_memory_()`, which moves it into shared memory that is no longer
pinned, so L3 and L4's "asynchronous" copies are blocking pageable copies; and its workers turn each
output into a fresh bytes object (`tobytes()`) before writing it. L4-pinned fixes the first,
L4-pinned-nocopy both.

Every output is checked: the device sums each output's bytes as int64 words (wrapping) after the
model step, and the host sums the bytes it received the same way; a level whose sums differ for any
step counts a mismatch and the script exits with status 1.

    python3 examples/pytorch/segmentation_egress.py                       # every level, reference shape
    python3 examples/pytorch/segmentation_egress.py --levels ideal,ferry --steps 20 --json out.json
    python3 examples/pytorch/segmentation_egress.py --dry-run             # tiny, on the CPU
"""
import argparse
import os
import queue
import shutil
import sys
import threading
import time

import numpy as np
import torch

import ladder_common as lc

LEVELS = {
    "ideal": "model steps only, no output copy (the ceiling)",
    "L0": "blocking copy into a fresh CPU tensor, processing inline",
    "L1": "as L0, fresh tensors handed to N worker processes",
    "L2": "shared pool of host buffers + free list, blocking copy",
    "L3": "non-blocking copy on the compute stream + event + monitor thread (pool not really pinned)",
    "L4": "copy on an egress stream that waits on the compute stream (pool not really pinned)",
    "L4-pinned": "L4 with the shared pool really pinned (cudaHostRegister)",
    "L4-pinned-nocopy": "L4-pinned, workers write from a zero-copy view instead of a bytes copy",
    "ferry": "ferry.torch.Egress, sink writes each output to /dev/null",
}
MASK = (1 << 64) - 1


# ---- the workload --------------------------------------------------------------------------------

class TinySegmenter(torch.nn.Module):
    """A small stand-in with DeepLabV3's interface (a dict with 'out' at the input's resolution), for
    machines without torchvision."""

    def __init__(self, classes):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(16, classes, 1))

    def forward(self, x):
        return {"out": self.body(x)}


def make_model(args, dev):
    if args.model == "tiny":
        model = TinySegmenter(args.classes)
    else:
        from torchvision.models.segmentation import deeplabv3_resnet50
        model = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=args.classes,
                                   aux_loss=False)
    return model.eval().to(dev.torch_device)


class InputLoader:
    """Inputs from a prefetched loader: a few distinct host batches (pinned on a GPU), step i's batch
    copied on a side stream while step i - 1 computes; the compute stream waits on the side stream
    before using it."""

    def __init__(self, dev, batch, size, distinct=2):
        g = torch.Generator().manual_seed(1234)
        self.dev = dev
        self.host = [dev.pin(torch.rand((batch, 3, size, size), generator=g)) for _ in range(distinct)]
        self.stream = dev.stream()
        self.ahead = None  # (step, device tensor) copied ahead

    def _copy(self, step):
        with self.dev.use_stream(self.stream):
            return step, self.host[step % len(self.host)].to(self.dev.torch_device, non_blocking=True)

    def get(self, step):
        if self.ahead is None or self.ahead[0] != step:
            self.ahead = self._copy(step)
        x = self.ahead[1]
        self.dev.current_stream().wait_stream(self.stream)
        if self.dev.is_cuda:
            x.record_stream(torch.cuda.current_stream())
        self.ahead = self._copy(step + 1)
        return x


class Workload:
    """The model step every level runs: the next input, the forward pass, and the output's int64 sum
    kept on the device (read once, after the level) for the check."""

    def __init__(self, args, dev, model, loader):
        self.args, self.dev, self.model, self.loader = args, dev, model, loader
        self.total = args.warmup + args.steps
        self.device_sums = torch.zeros(self.total, dtype=torch.int64, device=dev.torch_device)

    def step(self, i):
        out = self.model(self.loader.get(i))["out"]
        self.device_sums[i] = out.view(torch.int64).sum()
        return out

    def expected(self):
        return [int(s) & MASK for s in self.device_sums.cpu().tolist()]


def output_bytes(args):
    return args.batch * args.classes * args.size * args.size * 4


def int64_sum(buf):
    """The wrapping sum of `buf`'s bytes as int64 words, as an unsigned 64-bit Python int."""
    return int(np.frombuffer(buf, dtype=np.int64).sum()) & MASK


def process_reference(t, devnull):
    """The reference's post-processing: the output as a fresh bytes object, written out."""
    b = t.numpy().tobytes()
    devnull.write(b)
    return int64_sum(b), len(b)


def process_view(t, devnull):
    """The same processing from a zero-copy view of the output's memory."""
    view = memoryview(t.numpy()).cast("B")
    devnull.write(view)
    return int64_sum(view), len(view)


# ---- the reference's worker processes ------------------------------------------------------------

def _worker_main(pool, work_q, free_q, result_q, zero_copy):
    devnull = open(os.devnull, "wb", buffering=0)
    process = process_view if zero_copy else process_reference
    while True:
        item = work_q.get()
        if item is None:
            break
        step, idx, fresh = item
        total, n = process(fresh if fresh is not None else pool[idx], devnull)
        del fresh
        result_q.put((step, total, n))
        if idx is not None:
            free_q.put(idx)


class WorkerProcesses:
    """N worker processes that process outputs handed to them through a queue: fresh tensors (moved to
    shared memory by the queue) or indices into a shared pool, returned to the free list when done."""

    def __init__(self, n, pool, zero_copy=False):
        import torch.multiprocessing as mp
        ctx = mp.get_context("fork")  # the workers inherit the pool's shared mapping
        self.work_q, self.free_q, self.result_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
        if pool is not None:
            for i in range(len(pool)):
                self.free_q.put(i)
        self.procs = [ctx.Process(target=_worker_main, daemon=True,
                                  args=(pool, self.work_q, self.free_q, self.result_q, zero_copy))
                      for _ in range(n)]
        for p in self.procs:
            p.start()
        self.pushed = 0
        self.results = {}

    def push(self, step, idx=None, fresh=None):
        self.pushed += 1
        self.work_q.put((step, idx, fresh))

    def take_free(self):
        return self.free_q.get()

    def drain(self):
        while len(self.results) < self.pushed:
            if not all(p.is_alive() for p in self.procs):
                raise RuntimeError("a worker process died")
            try:
                step, total, n = self.result_q.get(timeout=1.0)
            except queue.Empty:
                continue
            self.results[step] = (total, n)

    def close(self):
        for _ in self.procs:
            self.work_q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


class Monitor:
    """The reference's monitor thread: waits on each copy's event, then hands the buffer to a worker.
    It holds the output tensor until then, so the caching allocator cannot reuse it mid-copy."""

    def __init__(self, workers):
        self.q = queue.Queue()
        self.workers = workers
        self.pending = 0
        self.cv = threading.Condition()
        self.error = None
        self.thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            step, idx, event, out = item
            try:
                event.synchronize()
                del out
                self.workers.push(step, idx)
            except Exception as e:  # noqa: BLE001 -- rethrown by drain()
                self.error = e
            with self.cv:
                self.pending -= 1
                self.cv.notify_all()

    def push(self, step, idx, event, out):
        with self.cv:
            self.pending += 1
        self.q.put((step, idx, event, out))

    def drain(self):
        with self.cv:
            self.cv.wait_for(lambda: self.pending == 0)
        if self.error:
            raise self.error

    def close(self):
        self.q.put(None)
        self.thread.join()


def shm_free_bytes():
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return 0


def shared_pool(args, n, pinned_first=True):
    """The reference's pool: `torch.empty(..., pin_memory=True).share_memory_()`, which leaves n whole-
    output buffers in shared memory that is not pinned. The pages are touched before timing."""
    shape = (args.batch, args.classes, args.size, args.size)
    need = n * output_bytes(args)
    if shm_free_bytes() < need + (1 << 30):
        raise RuntimeError(f"/dev/shm has {shm_free_bytes() / 1e9:.1f} GB free; the pool needs {need / 1e9:.1f} GB")
    pool = []
    for _ in range(n):
        t = torch.empty(shape, pin_memory=pinned_first and torch.cuda.is_available()).share_memory_()
        t.zero_()
        pool.append(t)
    return pool


# ---- the levels ----------------------------------------------------------------------------------

def run_level(name, args, dev, w):
    row = lc.Row(name, LEVELS[name])
    n_out = output_bytes(args)
    win = lc.Window()
    host_sums = {}
    if name == "ideal":
        for i in range(w.total):
            if i == args.warmup:
                dev.synchronize()
                win.begin()
            w.step(i)
        dev.synchronize()
        win.end()
        row.extra["checked_note"] = "no output leaves the device"
    elif name == "L0":
        devnull = open(os.devnull, "wb", buffering=0)
        for i in range(w.total):
            if i == args.warmup:
                win.begin()
            out = w.step(i)
            host_sums[i] = process_reference(out.cpu(), devnull)
        win.end()
    elif name == "L1":
        if shm_free_bytes() < (args.workers + 2) * n_out:
            raise RuntimeError(f"/dev/shm has {shm_free_bytes() / 1e9:.1f} GB free; L1's queue needs about "
                               f"{(args.workers + 2) * n_out / 1e9:.1f} GB")
        workers = WorkerProcesses(args.workers, None)
        try:
            for i in range(w.total):
                if i == args.warmup:
                    workers.drain()
                    win.begin()
                out = w.step(i)
                workers.push(i, fresh=out.cpu())
            workers.drain()
            win.end()
        finally:
            workers.close()
        host_sums = workers.results
    else:
        host_sums = run_pool_level(name, args, dev, w, win, row)
    row.set_window(args.steps, win)
    if name != "ideal":
        row.bytes_moved = args.steps * n_out
        expected = w.expected()
        row.checked = len(host_sums)
        row.mismatches = sum(1 for i in range(w.total)
                             if host_sums.get(i) != (expected[i], n_out))
    return row


def run_pool_level(name, args, dev, w, win, row):
    pinned = name.startswith("L4-pinned")
    pool = shared_pool(args, args.pool)
    row.extra["pool_pinned_before_share"] = True
    row.extra["pool_is_pinned"] = lc.is_pinned(pool[0])
    unregister = []
    if pinned and dev.is_cuda:
        t0 = time.perf_counter()
        unregister = [lc.host_register(t) for t in pool]
        row.extra["pin_seconds"] = time.perf_counter() - t0
        row.extra["pool_is_pinned"] = lc.is_pinned(pool[0])
    workers = WorkerProcesses(args.workers, pool, zero_copy=name == "L4-pinned-nocopy")
    monitor = Monitor(workers)
    egress = dev.stream()
    try:
        for i in range(w.total):
            if i == args.warmup:
                monitor.drain()
                workers.drain()
                win.begin()
            out = w.step(i)
            idx = workers.take_free()
            if name == "L2":
                pool[idx].copy_(out)
                workers.push(i, idx)
            elif name == "L3":
                pool[idx].copy_(out, non_blocking=True)
                e = dev.event()
                e.record()
                monitor.push(i, idx, e, out)
            else:
                egress.wait_stream(dev.current_stream())
                with dev.use_stream(egress):
                    pool[idx].copy_(out, non_blocking=True)
                    e = dev.event()
                    e.record()
                monitor.push(i, idx, e, out)
            del out
        monitor.drain()
        workers.drain()
        win.end()
    finally:
        monitor.close()
        workers.close()
        for u in unregister:
            u()
    return workers.results


def run_ferry(args, dev, w):
    """ferry.torch.Egress: each output is copied on ferry's egress stream, after the compute stream,
    into its pinned slots in slot-sized chunks, and handed to the sink on ferry's worker threads. The
    sink does the reference's processing (write the bytes to /dev/null, sum them) from the zero-copy
    view it is given."""
    from ferry.torch import Egress
    row = lc.Row("ferry", LEVELS["ferry"])
    devnull = open(os.devnull, "wb", buffering=0)
    lock = threading.Lock()
    host_sums = {}

    def sink(view, chunk):
        flat = view.reshape(-1)
        devnull.write(flat)
        s = int64_sum(flat)
        with lock:
            total, n = host_sums.get(chunk.tag, (0, 0))
            host_sums[chunk.tag] = ((total + s) & MASK, n + flat.nbytes)

    win = lc.Window()
    out = Egress(sink, slots=args.slots, slot_bytes=args.slot_mib << 20, workers=args.ferry_workers,
                 ordered=False, device=dev.torch_device)  # --device cpu: ferry's emulated device
    try:
        for i in range(w.total):
            if i == args.warmup:
                out.flush()
                win.begin()
            out.submit(w.step(i), tag=i)
        out.flush()
        win.end()
        stats = out.stats()
    finally:
        out.close()
    for key in ("pin_seconds", "d2h_gbps"):
        if key in stats:
            row.extra["ferry_" + key] = stats[key]
    n_out = output_bytes(args)
    expected = w.expected()
    row.set_window(args.steps, win)
    row.bytes_moved = args.steps * n_out
    row.checked = len(host_sums)
    row.mismatches = sum(1 for i in range(w.total) if host_sums.get(i) != (expected[i], n_out))
    return row


# ---- main ----------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default=",".join(LEVELS), help="comma-separated, from: " + ",".join(LEVELS))
    p.add_argument("--steps", type=int, default=10, help="timed steps per level (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=512, help="image height and width (default 512)")
    p.add_argument("--classes", type=int, default=21)
    p.add_argument("--model", choices=["deeplabv3", "tiny"], default="deeplabv3",
                   help="deeplabv3 (torchvision DeepLabV3-ResNet50, random weights) or a tiny stand-in")
    p.add_argument("--workers", type=int, default=8, help="reference worker processes (default 8)")
    p.add_argument("--pool", type=int, default=4, help="whole-output buffers in the reference pool (default 4)")
    p.add_argument("--slots", type=int, default=32, help="ferry: pinned slots (default 32)")
    p.add_argument("--slot-mib", type=int, default=64, help="ferry: MiB per slot (default 64)")
    p.add_argument("--ferry-workers", type=int, default=8, help="ferry: sink worker threads (default 8)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout)")
    p.add_argument("--dry-run", action="store_true",
                   help="a tiny run on the CPU (defaults: --device cpu --model tiny --batch 2 --size 32 --steps 2 "
                        "--warmup 1 --workers 2 --pool 2 --slots 4 --slot-mib 1 --ferry-workers 2)")
    if p.parse_args(argv).dry_run:  # new defaults; options given explicitly still win
        p.set_defaults(device="cpu", model="tiny", batch=2, size=32, steps=2, warmup=1, workers=2, pool=2,
                       slots=4, slot_mib=1, ferry_workers=2)
    a = p.parse_args(argv)
    for name in ("steps", "batch", "size", "classes", "workers", "pool", "slots", "slot_mib", "ferry_workers"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be at least 1")
    if a.warmup < 1:
        p.error(f"--warmup {a.warmup}: must be at least 1 (the first step tunes the model's kernels)")
    if a.size % 2:
        p.error(f"--size {a.size}: must be even (outputs are checked as int64 words)")
    a.level_list = lc.parse_levels(a.levels, LEVELS)
    return a


def main(argv=None):
    args = parse_args(argv)
    dev = lc.Device(args.device)
    torch.manual_seed(0)
    if dev.is_cuda:
        torch.backends.cudnn.benchmark = True
    with torch.inference_mode():
        model = make_model(args, dev)
        loader = InputLoader(dev, args.batch, args.size)
        # One untimed step first, so kernel selection stays out of every level.
        model(loader.get(0))
        dev.synchronize()

        def one(name):
            w = Workload(args, dev, model, loader)
            dev.empty_cache()
            return run_ferry(args, dev, w) if name == "ferry" else run_level(name, args, dev, w)

        rows = lc.run_levels(LEVELS, args.level_list, one)
    n_out = output_bytes(args)
    lc.print_table(rows, [
        ("level", 16, lambda r, i: r.name),
        ("steps/s", 8, lambda r, i: f"{r.steps_per_s:.2f}"),
        ("x ideal", 7, lc.ratio),
        ("D2H GB/s", 8, lambda r, i: f"{r.bytes_moved / r.seconds / 1e9:.2f}" if r.bytes_moved else "-"),
        ("CPU s/step", 10, lambda r, i: f"{r.cpu_seconds / r.steps:.2f}"),
        ("main", 5, lambda r, i: f"{r.cpu_parts[0] / r.steps:.2f}"),
        ("threads", 7, lambda r, i: f"{r.cpu_parts[1] / r.steps:.2f}"),
        ("workers", 7, lambda r, i: f"{r.cpu_parts[2] / r.steps:.2f}"),
        ("checked", 7, lambda r, i: f"{r.checked}" if r.name != "ideal" else "-"),
        ("wrong", 5, lambda r, i: f"{r.mismatches}"),
    ], f"segmentation egress: {args.model}, batch {args.batch}x3x{args.size}x{args.size}, "
       f"{args.classes} classes, {n_out / 1e9:.2f} GB out per step, {args.steps} timed steps, {dev.description()}")
    if args.json:
        lc.write_json(args.json, dev, args, rows, {"output_bytes": n_out})
    return lc.exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
