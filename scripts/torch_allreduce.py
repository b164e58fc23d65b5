#!/usr/bin/env python3
"""PyTorch's all-reduce over sizes, as a second reference beside nccl-tests for `ferry bench allreduce`.

One process per GPU (torch.multiprocessing), torch.distributed with the NCCL backend; for each size, fp32
tensors all-reduced (sum) `--warmup` times untimed, then `--iters` times back to back, timed on the host
from a barrier to torch.cuda.synchronize(). Prints JSON: per size the mean time over ranks, algbw and busbw
(nccl-tests' formulas: bytes / time, times 2(n-1)/n; GB = 1e9 bytes).

Usage: torch_allreduce.py [--gpus 2] [-b 1M] [-e 2G] [-f 2] [-n 20] [-w 5]
"""
import argparse
import json
import os
import sys
import time


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def worker(rank, world, sizes, iters, warmup, port, queue):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    times = []
    for s in sizes:
        x = torch.ones(s // 4, dtype=torch.float32, device="cuda")
        for _ in range(warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
        del x
    queue.put((rank, times))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("-b", type=size, default=size("1M"))
    p.add_argument("-e", type=size, default=size("2G"))
    p.add_argument("-f", type=int, default=2)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("--port", type=int, default=29533)
    a = p.parse_args()
    import torch
    import torch.multiprocessing as mp

    sizes = []
    s = a.b
    while s <= a.e:
        sizes.append(s // 4 * 4)
        s *= a.f
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, a.gpus, sizes, a.n, a.w, a.port, queue)) for r in range(a.gpus)]
    for proc in procs:
        proc.start()
    per_rank = dict(queue.get() for _ in procs)
    for proc in procs:
        proc.join()
    n = a.gpus
    rows = []
    for i, s in enumerate(sizes):
        t = sum(per_rank[r][i] for r in range(n)) / n
        algbw = s / t / 1e9
        rows.append({"size": s, "time_us": t * 1e6, "algbw": algbw, "busbw": algbw * 2 * (n - 1) / n})
    json.dump({"tool": "torch.distributed all_reduce", "torch": torch.__version__,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())), "ranks": n,
               "nccl_p2p_disable": os.environ.get("NCCL_P2P_DISABLE", ""), "rows": rows,
               "average_bus_bandwidth": sum(r["busbw"] for r in rows) / len(rows)}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
