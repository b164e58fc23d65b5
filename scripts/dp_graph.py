"""A whole data-parallel training step of ferry.torch.DataParallel captured in one CUDA graph, as torch's
notes capture a DDP step ("Usage with DistributedDataParallel": warm up eagerly on a side stream, then
capture forward, backward and the optimizer step with torch.cuda.graph), on one GPU at world size 1;
its replay rate against the same step run eagerly, and its parameters after the replays against plain
eager training of the same model (world size 1: the average is the gradient itself).

    python3 scripts/dp_graph.py [--model vit_l_32] [--dtype bfloat16] [--steps 30] [--out results.json]

Levels: plain (eager, the model alone), ferry (eager DataParallel), ferry_graph (the captured step,
replayed). Needs a GPU (the machines of docs/perf/); results are recorded in docs/PERFORMANCE.md.
"""
import argparse
import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

import ferry.torch
from dp_common import images, one_gpu, write_json  # scripts/, this script's folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_l_32")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=15, help="eager steps before capture (auto plan: >= 11)")
    p.add_argument("--capture-error-mode", default="global", choices=("global", "thread_local", "relaxed"))
    p.add_argument("--port", type=int, default=29561)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dev = one_gpu(args.port)
    dtype = getattr(torch, args.dtype)
    x, y = images(args.batch, dtype, dev)
    torch.manual_seed(0)
    base = getattr(torchvision.models, args.model)().to(dev, dtype)
    rows = {}

    def train(model, params, steps: int):
        opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return opt

    def timed(fn, steps: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
        return steps / (time.perf_counter() - t)

    # plain and ferry, eager: rates, and plain's parameters after warmup + steps for the check.
    plain = copy.deepcopy(base)
    opt = train(plain, plain.parameters(), args.warmup)

    def plain_step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(plain(x), y).backward()
        opt.step()

    rows["plain"] = {"steps_per_s": timed(plain_step, args.steps)}
    ref = [q.detach().float().clone() for q in plain.parameters()]
    del plain, opt

    model = copy.deepcopy(base)
    dp = ferry.torch.DataParallel(model)
    opt = train(dp, dp.parameters(), args.warmup)

    def ferry_step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(dp(x), y).backward()
        opt.step()

    rows["ferry"] = {"steps_per_s": timed(ferry_step, args.steps), "plan": dp.stats()["plan"]}
    dp.close()
    del dp, model, opt

    # The captured step: warm up on a side stream, capture, replay.
    model = copy.deepcopy(base)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dp = ferry.torch.DataParallel(model)
        opt = train(dp, dp.parameters(), args.warmup)
    torch.cuda.current_stream().wait_stream(side)
    row = {}
    try:
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph, capture_error_mode=args.capture_error_mode):
            F.cross_entropy(dp(x), y).backward()
            opt.step()
        row["steps_per_s"] = timed(graph.replay, args.steps)
        got = [q.detach().float() for q in model.parameters()]
        worst = max(float(((a - b).abs().max() / b.abs().max().clamp_min(1e-12))) for a, b in zip(got, ref))
        row["max_param_diff_vs_plain"] = worst
    except Exception as e:  # noqa: BLE001 - a capture that fails is the finding
        row["error"] = f"{type(e).__name__}: {e}"[:800]
    rows["ferry_graph"] = row
    try:
        dp.close()
    except Exception as e:  # noqa: BLE001
        row["close_error"] = f"{type(e).__name__}: {e}"[:300]

    print(f"{args.model} {args.dtype}, batch {args.batch}, 1 x {torch.cuda.get_device_name(0)}, "
          f"torch {torch.__version__}, world size 1, {args.warmup} eager steps then {args.steps} timed")
    for level, r in rows.items():
        rate = r.get("steps_per_s")
        extra = r.get("error") or (f"max param diff vs plain {r['max_param_diff_vs_plain']:.2e}"
                                   if "max_param_diff_vs_plain" in r else "")
        ratio = "" if rate is None else f"{rate / rows['plain']['steps_per_s']:.3f} of plain"
        print(f"{level:<12} {rate if rate is None else round(rate, 3)!s:>9} steps/s  {ratio}  {extra}")
    if args.out:
        write_json(args.out, {"model": args.model, "dtype": args.dtype, "batch": args.batch, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(0), "rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
