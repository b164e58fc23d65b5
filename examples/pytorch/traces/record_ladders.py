"""Records torch.profiler traces of both reference ladders, small enough to keep as test fixtures.

    python3 examples/pytorch/traces/record_ladders.py --out DIR [--only NAME,...]

The pipelines are the hand-written PyTorch versions of each ladder level (docs/TRACING.md lists each
level's fix), at small sizes so each trace holds a few steps:

ingest (training input): a small convolutional network trained with Adam on batches of random 3xHxW
float32 images made on the CPU, one sample at a time, by a torch Dataset.
  L0  DataLoader without workers (the main thread makes each batch), blocking copy from pageable memory
  L1  DataLoader with worker processes, blocking copy from pageable (shared) memory
  L2  DataLoader with workers and pin_memory, non-blocking copy on the compute stream
  L3  as L2, each batch copied on its own stream one step ahead; the compute stream waits on an event
  L4  as L3 inside a prefetching iterator that hands out batches already on the GPU

egress (inference output): a small fully convolutional network producing 21-class logits at the input
resolution; each output goes to a post-processing step that copies it into a fresh Python object
(bytes) and checksums it, in worker processes from L1 on.
  L0  compute, blocking copy into a fresh CPU tensor, process inline
  L1  blocking copy into a fresh CPU tensor per batch; a queue (which moves it to shared memory) feeds
      N worker processes
  L2  a pool of pre-allocated shared buffers and a free-list queue; still a blocking copy
  L3  the pool allocated with pin_memory=True and then share_memory_() (which leaves it unpinned), a
      non-blocking copy, an event per copy and a monitor thread that hands the buffer to the workers
  L4  as L3 with the copy on its own stream that waits on the compute stream
  L4pinned  as L4 with the shared pool registered with cudaHostRegister, so the copies are truly
      asynchronous

Each level is recorded with a profiler schedule (wait 1, warmup 1, active 4: ProfilerStep# spans) and
written by tensorboard_trace_handler as NAME.pt.trace.json.gz; some are also recorded without a
schedule (three iterations, no step spans) and written by export_chrome_trace as NAME.json. Every
recorded trace is then summarized by trace_facts.py. Needs a CUDA GPU; sizes are flags, and the model
widths left at 0 are picked by a calibration run first (see calibrate()).

The fixtures in tests/data/real_traces/ were made with the defaults (ingest L0 with --fresh 1, so that
making a batch on the main thread takes several steps); each one's command is in the manifest.
"""
import argparse
import glob
import os
import queue
import shutil
import sys
import threading
import time
import traceback
import zlib

import torch
import torch.multiprocessing as tmp
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import trace_facts  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 4
CTX = tmp.get_context("fork")  # workers touch no CUDA; fork keeps their start cheap


# ---------------------------------------------------------------------------------------------------
# Recording


class recorder:
    """Profiles one pipeline run: with a schedule (ProfilerStep# spans, tensorboard_trace_handler, .gz)
    or without (the whole run, export_chrome_trace, plain .json)."""

    def __init__(self, out, name, scheduled):
        self.out, self.name, self.scheduled = out, name, scheduled
        self.steps = WAIT + WARMUP + ACTIVE if scheduled else 3
        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        if scheduled:
            self.tmpdir = os.path.join(out, f".{name}.tb")
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.prof = profile(activities=acts, schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
                                on_trace_ready=tensorboard_trace_handler(self.tmpdir, worker_name=name,
                                                                         use_gzip=True))
        else:
            self.prof = profile(activities=acts)

    def __enter__(self):
        # Work queued before the profiler starts would run unrecorded and look like idle GPU time.
        torch.cuda.synchronize()
        self.prof.__enter__()
        return self

    def step(self):
        if self.scheduled:
            self.prof.step()

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.prof.__exit__(*exc)
        if exc[0] is not None:
            return False
        if self.scheduled:
            (made,) = glob.glob(os.path.join(self.tmpdir, "*.pt.trace.json.gz"))
            self.path = os.path.join(self.out, f"{self.name}.pt.trace.json.gz")
            os.replace(made, self.path)
            shutil.rmtree(self.tmpdir)
        else:
            self.path = os.path.join(self.out, f"{self.name}.json")
            self.prof.export_chrome_trace(self.path + ".partial")
            os.replace(self.path + ".partial", self.path)
        return False


# ---------------------------------------------------------------------------------------------------
# ingest: training input


class random_images(torch.utils.data.Dataset):
    """Samples made on the CPU on demand: a 3xHxW float32 image and a label. A share `fresh` of each
    image's rows is drawn at random (the decode/augment work of a real loader), the rest copied from a
    base image, so the cost of making a batch is a flag."""

    def __init__(self, size, fresh, length=1 << 20):
        self.size, self.length = size, length
        self.rows = max(1, round(fresh * size))
        self.base = None

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        if self.base is None:  # made in the process that uses it (a worker, or the main thread at L0)
            self.base = torch.rand(3, self.size, self.size)
        img = self.base.clone()
        img[:, : self.rows] = torch.rand(3, self.rows, self.size)
        return img, i % 10


def train_model(width):
    # A 4x4 patch stem, then three stages: few layers, so kernels rather than launches fill the step.
    c = width
    layers, cin = [torch.nn.Conv2d(3, c, 4, stride=4, bias=False), torch.nn.BatchNorm2d(c),
                   torch.nn.ReLU(inplace=True)], c
    for cout, stride in ((c, 1), (2 * c, 2), (4 * c, 2)):
        layers += [torch.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                   torch.nn.ReLU(inplace=True)]
        cin = cout
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, 10)]
    return torch.nn.Sequential(*layers).cuda()


class trainer:
    def __init__(self, a):
        torch.manual_seed(0)
        self.model = train_model(a.width)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss


def loader(a, workers, pin):
    kw = dict(batch_size=a.batch, num_workers=workers, pin_memory=pin)
    if workers:
        kw.update(prefetch_factor=PREFETCH, persistent_workers=True)
    return torch.utils.data.DataLoader(random_images(a.size, a.fresh), **kw)


PREFETCH = 2


def warmup_steps(a):
    """Steps run before the profiler starts: enough for every worker's first batches to have arrived and
    for the pinned-memory cache to hold as many batches as are in flight (no cudaHostAlloc in the trace)."""
    return a.workers * PREFETCH + 4


def ingest_l0(a, rec_factory):
    t, it = trainer(a), iter(loader(a, 0, False))
    for _ in range(warmup_steps(a)):  # warm-up outside the profiler (cuDNN picks its algorithms)
        x, y = next(it)
        t.step(x.cuda(), y.cuda())
    with rec_factory() as rec:
        for _ in range(rec.steps):
            x, y = next(it)
            t.step(x.cuda(), y.cuda())
            rec.step()
    return rec


def ingest_l1(a, rec_factory):
    t, it = trainer(a), iter(loader(a, a.workers, False))
    for _ in range(warmup_steps(a)):
        x, y = next(it)
        t.step(x.cuda(), y.cuda())
    with rec_factory() as rec:
        for _ in range(rec.steps):
            x, y = next(it)
            t.step(x.cuda(), y.cuda())
            rec.step()
    return rec


def ingest_l2(a, rec_factory):
    t, it = trainer(a), iter(loader(a, a.workers, True))
    for _ in range(warmup_steps(a)):
        x, y = next(it)
        t.step(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
    with rec_factory() as rec:
        for _ in range(rec.steps):
            x, y = next(it)
            t.step(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
            rec.step()
    return rec


def copy_ahead(batch, stream):
    """Copies a pinned batch on `stream`; returns the device tensors and the event that marks them ready."""
    with torch.cuda.stream(stream):
        x = batch[0].cuda(non_blocking=True)
        y = batch[1].cuda(non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(stream)
    return x, y, ready


def ingest_l3(a, rec_factory):
    t, it = trainer(a), iter(loader(a, a.workers, True))
    copy_stream = torch.cuda.Stream()
    compute = torch.cuda.current_stream()
    nxt = copy_ahead(next(it), copy_stream)

    def one():
        nonlocal nxt
        x, y, ready = nxt
        compute.wait_event(ready)
        x.record_stream(compute)
        y.record_stream(compute)
        nxt = copy_ahead(next(it), copy_stream)  # batch N+1 copies while batch N computes
        t.step(x, y)

    for _ in range(warmup_steps(a)):
        one()
    with rec_factory() as rec:
        for _ in range(rec.steps):
            one()
            rec.step()
    return rec


class cuda_prefetcher:
    """Hands out batches already on the GPU: the copy of the next batch runs on a side stream while the
    caller computes on the current one."""

    def __init__(self, it):
        self.it, self.stream = it, torch.cuda.Stream()
        self.nxt = self._load()

    def _load(self):
        with record_function("prefetch next batch"):
            return copy_ahead(next(self.it), self.stream)

    def __iter__(self):
        return self

    def __next__(self):
        x, y, ready = self.nxt
        compute = torch.cuda.current_stream()
        compute.wait_event(ready)
        x.record_stream(compute)
        y.record_stream(compute)
        self.nxt = self._load()
        return x, y


def ingest_l4(a, rec_factory):
    t = trainer(a)
    pf = cuda_prefetcher(iter(loader(a, a.workers, True)))
    for _ in range(warmup_steps(a)):
        t.step(*next(pf))
    with rec_factory() as rec:
        for _ in range(rec.steps):
            t.step(*next(pf))
            rec.step()
    return rec


# ---------------------------------------------------------------------------------------------------
# egress: inference output


def seg_model(width):
    c = width
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, c, 3, padding=1), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(c, 21, 1)).cuda().eval()


def process(t):
    """The post-processing/storage step: a fresh Python bytes object holding the output, checksummed."""
    blob = t.numpy().tobytes()
    return zlib.adler32(blob)


def egress_inputs(a):
    torch.manual_seed(0)
    return torch.rand(a.ebatch, 3, a.esize, a.esize, device="cuda")


def out_shape(a):
    return (a.ebatch, 21, a.esize, a.esize)


def egress_l0(a, rec_factory, annotate=True):
    model, x = seg_model(a.ewidth), egress_inputs(a)
    with torch.no_grad():
        def one():
            out = model(x)
            y = out.cpu()  # blocking copy into a fresh pageable tensor
            if annotate:
                with record_function("process output"):
                    process(y)
            else:
                process(y)  # plain Python: no profiler op covers it

        one()
        with rec_factory() as rec:
            for _ in range(rec.steps):
                one()
                rec.step()
    return rec


def fresh_worker(work, done):
    while True:
        item = work.get()
        if item is None:
            return
        done.put(process(item))


def egress_l1(a, rec_factory):
    model, x = seg_model(a.ewidth), egress_inputs(a)
    work, done = CTX.Queue(), CTX.Queue()
    procs = [CTX.Process(target=fresh_worker, args=(work, done), daemon=True) for _ in range(a.eworkers)]
    for p in procs:
        p.start()
    sent = 0
    with torch.no_grad():
        def one():
            nonlocal sent
            out = model(x)
            y = out.cpu()  # blocking copy into a fresh pageable tensor, every batch
            work.put(y)  # the queue moves it to shared memory for the workers
            sent += 1

        one()
        with rec_factory() as rec:
            for _ in range(rec.steps):
                one()
                rec.step()
    for _ in procs:
        work.put(None)
    for _ in range(sent):
        done.get()
    for p in procs:
        p.join()
    return rec


def pool_worker(pool, work, free, done):
    while True:
        i = work.get()
        if i is None:
            return
        done.put(process(pool[i]))
        free.put(i)


class egress_pool:
    """A fixed pool of shared host buffers, a free list and N worker processes that process and return
    them. pinned: allocate with pin_memory=True (then share_memory_(), as the reference did); register:
    cudaHostRegister each shared buffer so it really is page-locked."""

    def __init__(self, a, pinned=False, register=False):
        shape = out_shape(a)
        self.pool = []
        for _ in range(a.epool):
            b = torch.empty(shape, pin_memory=pinned).share_memory_()
            b.fill_(0)  # touch every page now, not during the first copy
            if register:
                rc = torch.cuda.cudart().cudaHostRegister(b.data_ptr(), b.numel() * b.element_size(), 0)
                if int(rc) != 0:
                    raise RuntimeError(f"cudaHostRegister failed: {rc}")
            self.pool.append(b)
        self.registered = register
        self.work, self.free, self.done = CTX.Queue(), CTX.Queue(), CTX.Queue()
        for i in range(a.epool):
            self.free.put(i)
        self.procs = [CTX.Process(target=pool_worker, args=(self.pool, self.work, self.free, self.done),
                                  daemon=True) for _ in range(a.eworkers)]
        for p in self.procs:
            p.start()
        self.sent = 0

    def acquire(self):
        with record_function("wait for free buffer"):
            return self.free.get()

    def hand_over(self, i):
        self.work.put(i)
        self.sent += 1

    def close(self):
        for _ in self.procs:
            self.work.put(None)
        for _ in range(self.sent):
            self.done.get()
        for p in self.procs:
            p.join()
        if self.registered:
            for b in self.pool:
                torch.cuda.cudart().cudaHostUnregister(b.data_ptr())


def pool_warmup(a):
    """Batches run before the profiler starts at the pooled levels: enough for the buffers in flight to
    reach what the pool and the workers allow when post-processing is the slower side."""
    return 6 * a.epool


def egress_l2(a, rec_factory):
    model, x = seg_model(a.ewidth), egress_inputs(a)
    pool = egress_pool(a)
    with torch.no_grad():
        def one():
            out = model(x)
            i = pool.acquire()
            pool.pool[i].copy_(out)  # blocking copy into a reused pageable buffer
            pool.hand_over(i)

        for _ in range(pool_warmup(a)):  # until the pool is in its steady state
            one()
        with rec_factory() as rec:
            for _ in range(rec.steps):
                one()
                rec.step()
    pool.close()
    return rec


class monitor:
    """Waits on each copy's event, then hands the buffer to the workers: reading a buffer before its copy
    finished would yield corrupt data."""

    def __init__(self, pool):
        self.pool, self.q = pool, queue.Queue()
        self.thread = threading.Thread(target=self._run, name="egress monitor", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            i, ev = item
            ev.synchronize()
            self.pool.hand_over(i)

    def close(self):
        self.q.put(None)
        self.thread.join()


def egress_async(a, rec_factory, pinned, register, side_stream):
    model, x = seg_model(a.ewidth), egress_inputs(a)
    pool = egress_pool(a, pinned=pinned, register=register)
    mon = monitor(pool)
    copy_stream = torch.cuda.Stream() if side_stream else None
    compute = torch.cuda.current_stream()
    with torch.no_grad():
        def one():
            out = model(x)
            i = pool.acquire()
            s = copy_stream or compute
            if side_stream:
                s.wait_stream(compute)  # the copy waits for the output, on its own stream
            with torch.cuda.stream(s):
                pool.pool[i].copy_(out, non_blocking=True)
                done = torch.cuda.Event()
                done.record(s)
            if side_stream:
                out.record_stream(s)
            mon.q.put((i, done))

        for _ in range(pool_warmup(a)):  # until the pool is in its steady state
            one()
        with rec_factory() as rec:
            for _ in range(rec.steps):
                one()
                rec.step()
    mon.close()
    pool.close()
    return rec


def egress_l3(a, rec_factory):
    return egress_async(a, rec_factory, pinned=True, register=False, side_stream=False)


def egress_l4(a, rec_factory):
    return egress_async(a, rec_factory, pinned=True, register=False, side_stream=True)


def egress_l4pinned(a, rec_factory):
    return egress_async(a, rec_factory, pinned=False, register=True, side_stream=True)


# ---------------------------------------------------------------------------------------------------

# name -> (pipeline, scheduled)
RUNS = {
    "ingest_L0": (ingest_l0, True),
    "ingest_L1": (ingest_l1, True),
    "ingest_L2": (ingest_l2, True),
    "ingest_L3": (ingest_l3, True),
    "ingest_L4": (ingest_l4, True),
    "ingest_L1_noschedule": (ingest_l1, False),
    "ingest_L4_noschedule": (ingest_l4, False),
    "egress_L0": (egress_l0, True),
    "egress_L1": (egress_l1, True),
    "egress_L2": (egress_l2, True),
    "egress_L3": (egress_l3, True),
    "egress_L4": (egress_l4, True),
    "egress_L4pinned": (egress_l4pinned, True),
    "egress_L0_unannotated_noschedule": (lambda a, r: egress_l0(a, r, annotate=False), False),
    "egress_L4pinned_noschedule": (egress_l4pinned, False),
}


def timed(fn, n=5):
    """Mean milliseconds per call of fn, after one untimed call, the GPU synchronized at both ends."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


WIDTHS = [16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256, 320, 384]


def calibrate(a):
    """Times (no profiler) the pieces the ladders trade against each other and picks the model widths, so
    that each level is bound by what the ladder says bounds it:
    ingest: a training step of about a.step_ms_per_mb ms per MB of batch, so the pinned copy of a batch
      is about a tenth of the step (serialized at L2, hidden at L3/L4), the blocking pageable copy a third
      or more (L1), and the main thread making a batch several steps (L0), while the workers keep up;
    egress: a forward pass shorter than the time the worker processes need per batch (measured with all
      of them busy) by half a blocking pageable copy, so the pinned, overlapped level waits for
      post-processing while the blocking levels, forward plus copy, are bound by the copy."""
    host = torch.rand(a.batch, 3, a.size, a.size)
    mb = host.numel() * 4 / 1e6
    pinned = host.pin_memory()
    ds = random_images(a.size, a.fresh)
    print(f"ingest batch {a.batch}x3x{a.size}x{a.size} ({mb:.1f} MB): pinned H2D {timed(lambda: pinned.cuda()):.2f} ms, "
          f"pageable H2D {timed(lambda: host.cuda()):.2f} ms, pin (memcpy) {timed(lambda: host.pin_memory()):.2f} ms, "
          f"make batch {timed(lambda: torch.stack([ds[i][0] for i in range(a.batch)]), 2):.1f} ms (one thread; "
          f"{a.workers} workers)")
    x = torch.rand(a.batch, 3, a.size, a.size, device="cuda")
    y = torch.randint(0, 10, (a.batch,), device="cuda")
    # The loader's own pace (workers, shared-memory transfer, pin thread), measured with nothing else
    # running: a step shorter than it would leave every level waiting on the loader.
    lt = iter(loader(a, a.workers, True))
    for _ in range(warmup_steps(a)):
        next(lt)
    t0 = time.perf_counter()
    for _ in range(20):
        next(lt)
    feed = (time.perf_counter() - t0) / 20 * 1e3
    del lt
    target = max(a.step_ms_per_mb * mb, 1.3 * feed)
    print(f"  loader with pin_memory: {feed:.1f} ms per batch; step target {target:.1f} ms")
    tried = {}
    for w in ([a.width] if a.width else WIDTHS):
        t = trainer(argparse.Namespace(width=w))
        tried[w] = timed(lambda: t.step(x, y))
        print(f"  width {w}: train step {tried[w]:.2f} ms (target {target:.2f})")
        if tried[w] >= target:
            break
    a.width = min(tried, key=lambda w: abs(tried[w] - target))
    del t, x, y
    out = torch.rand(out_shape(a), device="cuda")
    pe, ce = torch.empty(out.shape, pin_memory=True), torch.empty(out.shape)
    proc = timed(lambda: process(ce), 3)
    pageable = timed(lambda: ce.copy_(out))
    pool = egress_pool(a)
    t0 = time.perf_counter()
    n = 3 * a.eworkers
    for k in range(n):
        pool.hand_over(pool.acquire())
    for _ in range(n):
        pool.done.get()
    per_batch = (time.perf_counter() - t0) / n * 1e3
    pool.sent = 0
    pool.close()
    print(f"egress output {tuple(out.shape)} ({out.numel() * 4 / 1e6:.1f} MB): D2H pinned {timed(lambda: pe.copy_(out)):.2f} ms, "
          f"D2H pageable reused {pageable:.2f} ms, D2H fresh {timed(lambda: out.cpu()):.2f} ms, "
          f"process {proc:.1f} ms (one process), {per_batch:.1f} ms per batch with {a.eworkers} workers, pool {a.epool}")
    xe = egress_inputs(a)
    # Post-processing per batch halfway between the forward alone and the forward plus a blocking copy.
    etarget = per_batch - pageable / 2
    tried = {}
    with torch.no_grad():
        for w in ([a.ewidth] if a.ewidth else WIDTHS):
            m = seg_model(w)
            tried[w] = timed(lambda: m(xe))
            print(f"  egress width {w}: forward {tried[w]:.2f} ms (target {etarget:.2f})")
            if tried[w] >= etarget:
                break
    a.ewidth = min(tried, key=lambda w: abs(tried[w] - etarget))
    print(f"chosen: --width {a.width} --ewidth {a.ewidth}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=320)
    p.add_argument("--fresh", type=float, default=0.1, help="share of each sample's rows drawn at random")
    p.add_argument("--width", type=int, default=0, help="training model width; 0: pick by calibration")
    p.add_argument("--step-ms-per-mb", type=float, default=0.25,
                   help="calibration target of the training step, at least 1.3 times the loader's pace")
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--ebatch", type=int, default=8)
    p.add_argument("--esize", type=int, default=256)
    p.add_argument("--ewidth", type=int, default=0, help="egress model width; 0: pick by calibration")
    p.add_argument("--eworkers", type=int, default=12)
    p.add_argument("--epool", type=int, default=0, help="egress buffers; 0: eworkers + 2")
    a = p.parse_args()
    a.epool = a.epool or a.eworkers + 2
    if not 0 < a.fresh <= 1:
        raise SystemExit(f"--fresh {a.fresh}: must be in (0, 1]")
    os.makedirs(a.out, exist_ok=True)
    names = [n for n in a.only.split(",") if n] or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"--only {','.join(unknown)}: not a run; runs are {', '.join(RUNS)}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {os.cpu_count()} CPUs", flush=True)
    if not a.width or not a.ewidth:
        calibrate(a)
    failed = []
    for n in names:
        fn, scheduled = RUNS[n]
        t0 = time.perf_counter()
        try:
            rec = fn(a, lambda: recorder(a.out, n, scheduled))
        except Exception:  # one broken level must not lose the others' traces
            traceback.print_exc()
            failed.append(n)
            continue
        size = os.path.getsize(rec.path)
        print(f"== {n}: {os.path.basename(rec.path)} {size / 1e3:.0f} kB in {time.perf_counter() - t0:.1f} s",
              flush=True)
        trace_facts.facts(rec.path, top=5)
        sys.stdout.flush()
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
