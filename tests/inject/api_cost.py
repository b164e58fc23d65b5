"""What one CUDA call costs the calling thread, plain and under `ferry trace` (or torch.profiler with
--kineto): the calls PyTorch's eager mode makes around every kernel and every side-stream copy, each timed
alone over --calls calls. `scripts/gpu.sh trace-cost api` runs it plain and under each recording variant,
interleaved, and tabulates the microseconds per call; the difference is what the recording adds to that call.
Writes {"ops": {name: us_per_call}} to --json."""
import argparse
import contextlib
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=20000)
p.add_argument("--json")
p.add_argument("--kineto", choices=["cuda"], help="time the calls inside torch.profiler.profile (CUDA only)")
args = p.parse_args()

dev = torch.device("cuda")
one = torch.zeros(1, device=dev)
side = torch.cuda.Stream()
ev = torch.cuda.Event()
host = torch.zeros(256, pin_memory=True)
dst = torch.empty(256, device=dev)


def get_device():
    torch.cuda.current_device()


def launch():  # one tiny kernel: the launch and the runtime calls around it
    one.add_(1)


def event_record():
    ev.record()


def event_query():
    ev.query()


def wait_event():  # the current stream waits for the event (recorded on it by event_record): no host wait
    torch.cuda.current_stream().wait_event(ev)


def sync_idle():  # a synchronize of a stream with no work: the call's own cost
    side.synchronize()


def copy_h2d():  # a 1 KiB pinned copy, asynchronous
    dst.copy_(host, non_blocking=True)


def side_stream_tensor():  # allocated on the side stream, used on the compute stream, freed: the
    with torch.cuda.stream(side):  # caching allocator records an event at the free and queries it later
        t = torch.empty(256, device=dev)
    t.record_stream(torch.cuda.current_stream())
    del t


OPS = [get_device, launch, event_record, event_query, wait_event, sync_idle, copy_h2d, side_stream_tensor]


def time_op(fn, n):
    for _ in range(min(n, 1000)):  # warm-up: caches, first-call paths
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


profiler = contextlib.nullcontext()
if args.kineto:
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
with profiler:
    # The loop's own cost (a Python call of a function that does nothing), to read the others against.
    results = {"python_call": time_op(lambda: None, args.calls)}
    for op in OPS:
        results[op.__name__] = time_op(op, args.calls)
print(" ".join(f"{k} {v:.2f}" for k, v in results.items()))
if args.json:
    with open(args.json, "w") as f:
        json.dump({"ops": results}, f)
