"""ferry.torch.DataParallel under torch.compile, beside DDP under torch.compile, on one GPU at world size 1:
the same model, seed and data for every level, trained `--steps` steps; each level's losses against DDP's,
its steps/s over the last half, and the graphs and graph breaks torch._dynamo.explain counts in its forward.

    python3 scripts/dp_compile.py [--model vit_b_32] [--steps 60] [--levels ...] [--out results.json]

Levels: plain (the compiled model alone, the ceiling), ddp (torch.compile(DDP(model)), as DDP's docs
order it: DDPOptimizer splits the graph at its buckets), ferry_inner (DataParallel(torch.compile(model))),
ferry_outer (torch.compile(DataParallel(model))). Needs torch 2.x and a GPU (the machines of
docs/perf/); results are recorded in docs/PERFORMANCE.md.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

import ferry.torch
from dp_common import one_gpu, write_json  # scripts/, this script's folder

LEVELS = ("plain", "ddp", "ferry_inner", "ferry_outer")


def wrap(level: str, model):
    if level == "plain":
        return torch.compile(model), None
    if level == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=25,
                                                        gradient_as_bucket_view=True)
        return torch.compile(ddp), None
    if level == "ferry_inner":
        dp = ferry.torch.DataParallel(torch.compile(model))
        return dp, dp
    if level == "ferry_outer":
        dp = ferry.torch.DataParallel(model)
        return torch.compile(dp), dp
    raise SystemExit(f"--levels: unknown level {level!r} ({', '.join(LEVELS)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_b_32")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--port", type=int, default=29551)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dev = one_gpu(args.port)
    g = torch.Generator(device=dev).manual_seed(0)
    xs = torch.randn(4, args.batch, 3, 224, 224, device=dev, generator=g)
    ys = torch.randint(0, 1000, (4, args.batch), device=dev, generator=g)
    rows = {}
    for level in args.levels.split(","):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = getattr(torchvision.models, args.model)().to(dev)
        wrapped, dp = wrap(level, model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        row = {"level": level}
        try:
            explained = torch._dynamo.explain(wrapped)(xs[0])
            row.update(graphs=explained.graph_count, graph_breaks=explained.graph_break_count,
                       break_reasons=sorted({str(b.reason)[:160] for b in explained.break_reasons}))
        except Exception as e:  # noqa: BLE001 - a level explain cannot take is still trained
            row["explain_error"] = f"{type(e).__name__}: {e}"[:300]
        losses = []
        t0 = None
        try:
            for i in range(args.steps):
                if i == args.steps // 2:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(wrapped(xs[i % 4]), ys[i % 4])
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            torch.cuda.synchronize()
            row["steps_per_s"] = (args.steps - args.steps // 2) / (time.perf_counter() - t0)
            row["losses"] = [float(v) for v in losses]
            if dp is not None:
                row["plan"] = dp.stats()["plan"]
        except Exception as e:  # noqa: BLE001 - reported in the table: a level that fails is a finding
            row["error"] = f"{type(e).__name__}: {e}"[:600]
        if dp is not None:
            dp.close()
        rows[level] = row
        print(json.dumps({k: v for k, v in row.items() if k != "losses"}), flush=True)
        del wrapped, model, opt, dp
        torch.cuda.empty_cache()
    ref = rows.get("ddp", {}).get("losses")
    print(f"{args.model}, batch {args.batch}, {args.steps} steps, 1 x {torch.cuda.get_device_name(0)}, "
          f"torch {torch.__version__}, world size 1")
    print("level        steps/s  graphs  breaks  max |loss - ddp's| / ddp's  last loss")
    for level, r in rows.items():
        diff = "-"
        if ref and r.get("losses"):
            diff = f"{max(abs(a - b) / abs(b) for a, b in zip(r['losses'], ref)):.2e}"
        print(f"{level:<12} {r.get('steps_per_s', float('nan')):7.2f} {r.get('graphs', '-')!s:>7} "
              f"{r.get('graph_breaks', '-')!s:>7}  {diff:>26}  {r['losses'][-1] if r.get('losses') else r.get('error')}")
    if args.out:
        write_json(args.out, {"model": args.model, "batch": args.batch, "steps": args.steps, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(0), "rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
