"""A data-parallel wrapper's cost at world size 1 on one GPU, with the levels interleaved: plain training,
DDP (100 MB buckets, gradients as bucket views, static graph) and ferry.torch.DataParallel each own a copy
of the model and its optimizer, and the timed rounds take `--block` steps of each level in turn, so that
the GPU's clocks, the allocator's state and whatever else drifts during a process weigh on every level
alike (run one after another, the order of the levels moved them by up to 28% in pure bf16).

    python3 scripts/dp_interleaved.py [--model vit_l_32] [--dtype bfloat16] [--rounds 6] [--block 8]
                                      [--set-to-none | --zero-in-place] [--out results.json]

Per level: the median over rounds of its steps/s, and that median over plain's, per round then median.
Needs a GPU (the machines of docs/perf/); results are recorded in docs/PERFORMANCE.md.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

import ferry.torch
from dp_common import images, one_gpu, write_json  # scripts/, this script's folder

LEVELS = ("plain", "ddp", "ferry")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_l_32")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--block", type=int, default=8, help="steps of one level in a row (default 8)")
    p.add_argument("--warmup", type=int, default=12, help="untimed steps of each level first (auto plan: >= 11)")
    p.add_argument("--zero-in-place", action="store_true", help="zero_grad(set_to_none=False)")
    p.add_argument("--port", type=int, default=29571)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dev = one_gpu(args.port)
    dtype = getattr(torch, args.dtype)
    x, y = images(args.batch, dtype, dev)
    models, opts, closers = {}, {}, []
    for level in LEVELS:
        torch.manual_seed(0)
        m = getattr(torchvision.models, args.model)().to(dev, dtype)
        if level == "ddp":
            w = torch.nn.parallel.DistributedDataParallel(m, device_ids=[0], bucket_cap_mb=100,
                                                          gradient_as_bucket_view=True, static_graph=True)
        elif level == "ferry":
            w = ferry.torch.DataParallel(m)
            closers.append(w.close)
        else:
            w = m
        models[level], opts[level] = w, torch.optim.SGD(w.parameters(), lr=1e-3, momentum=0.9)

    def steps(level: str, n: int) -> None:
        m, opt = models[level], opts[level]
        for _ in range(n):
            opt.zero_grad(set_to_none=not args.zero_in_place)
            F.cross_entropy(m(x), y).backward()
            opt.step()

    for level in LEVELS:
        steps(level, args.warmup)
    torch.cuda.synchronize()
    rates = {level: [] for level in LEVELS}
    for r in range(args.rounds):
        order = LEVELS if r % 2 == 0 else tuple(reversed(LEVELS))  # ABC, CBA, ...: no level always first
        for level in order:
            torch.cuda.synchronize()
            t = time.perf_counter()
            steps(level, args.block)
            torch.cuda.synchronize()
            rates[level].append(args.block / (time.perf_counter() - t))
    rows = {}
    for level in LEVELS:
        ratio = [a / b for a, b in zip(rates[level], rates["plain"])]
        rows[level] = {"steps_per_s": statistics.median(rates[level]), "rounds": rates[level],
                       "of_plain": statistics.median(ratio), "of_plain_min": min(ratio), "of_plain_max": max(ratio)}
    for close in closers:
        close()
    print(f"{args.model} {args.dtype}, batch {args.batch}, set_to_none={not args.zero_in_place}, 1 x "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, world size 1, {args.rounds} interleaved "
          f"rounds of {args.block} steps per level")
    print("level   steps/s  of plain (min..max over rounds)")
    for level, r in rows.items():
        print(f"{level:<6} {r['steps_per_s']:8.3f}  {r['of_plain']:.3f} ({r['of_plain_min']:.3f}..{r['of_plain_max']:.3f})")
    if args.out:
        write_json(args.out, {"model": args.model, "dtype": args.dtype, "batch": args.batch, "args": vars(args),
                              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
