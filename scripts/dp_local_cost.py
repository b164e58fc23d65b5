"""The local cost of a data-parallel wrapper at world size 1 (no link: everything it adds to a step is its
own work), on one GPU: plain training, DDP (100 MB buckets, gradients as bucket views, static graph) and
ferry.torch.DataParallel, each with zero_grad(set_to_none=True) (torch's default, which drops the
gradients' views every step, so each gradient is copied into the bucket as it arrives) and with
set_to_none=False (the views stay; zeroing is one pass). For ferry it also times, on the CPU, the
Python it runs in backward (the start: seating the gradients, arming the C hooks; and the end-of-backward
callback), and reports how long loss.backward() held the main
thread against the step's GPU time (a wrapper's CPU work costs GPU time only when the CPU falls behind).

    python3 scripts/dp_local_cost.py [--model vit_l_32] [--steps 30] [--warmup 15] [--out results.json]

Run on one GPU as the data-parallel runs' notes say (docs/perf/2026-11-26/h200x4-dp/README.md, "The
stages' commands"); results are recorded in docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

import ferry.torch
from dp_host_breakdown import time_ferry_hooks  # scripts/, this script's folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_l_32")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device=dev, generator=g)
    y = torch.randint(0, 1000, (args.batch,), device=dev, generator=g)

    # CPU time inside ferry's hooks and end-of-backward callback (patched around the methods).
    spent = time_ferry_hooks()

    rows = []
    for level in ("plain", "ddp", "ferry"):
        for set_to_none in (True, False):
            torch.manual_seed(0)
            model = getattr(torchvision.models, args.model)(weights=None).to(dev)
            if level == "ddp":
                wrapped = torch.nn.parallel.DistributedDataParallel(
                    model, device_ids=[0], bucket_cap_mb=100, gradient_as_bucket_view=True, static_graph=True)
            elif level == "ferry":
                wrapped = ferry.torch.DataParallel(model)
            else:
                wrapped = model
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            backward_cpu = 0.0
            for step in range(args.warmup + args.steps):
                if step == args.warmup:
                    torch.cuda.synchronize()
                    for k in spent:
                        spent[k] = 0
                    backward_cpu = 0.0
                    t0 = time.perf_counter()
                opt.zero_grad(set_to_none=set_to_none)
                loss = F.cross_entropy(wrapped(x), y)
                t = time.perf_counter()
                loss.backward()
                backward_cpu += time.perf_counter() - t
                opt.step()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            row = {"level": level, "set_to_none": set_to_none, "ms_per_step": seconds / args.steps * 1e3,
                   "backward_cpu_ms": backward_cpu / args.steps * 1e3}
            if level == "ferry":
                row.update(start_cpu_ms=spent["start_s"] / args.steps * 1e3,
                           finish_cpu_ms=spent["finish_s"] / args.steps * 1e3, plan=wrapped.stats()["plan"])
                wrapped.close()
            rows.append(row)
            print(json.dumps(row), flush=True)
            del wrapped, model, opt
            torch.cuda.empty_cache()
    base = {r["set_to_none"]: r["ms_per_step"] for r in rows if r["level"] == "plain"}
    print(f"{args.model}, batch {args.batch}, 1 x {torch.cuda.get_device_name(0)}, world size 1")
    print("level  set_to_none  ms/step  x plain  backward CPU ms  backward start CPU ms")
    for r in rows:
        extra = f"  {r['start_cpu_ms']:.2f}" if "start_cpu_ms" in r else ""
        print(f"{r['level']:<6} {str(r['set_to_none']):<11} {r['ms_per_step']:8.2f} "
              f"{base[True] / r['ms_per_step']:7.3f} {r['backward_cpu_ms']:15.2f}{extra}")
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump({"model": args.model, "batch": args.batch, "gpu": torch.cuda.get_device_name(0),
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
