"""The host cost of a data-parallel wrapper per gradient and per step, on the CPU (no GPU: the emulated
device), at world size 1: plain training, torch's DDP (gloo, 100 MB buckets, gradients as bucket views,
static graph) and ferry.torch.DataParallel, on a model of many small parameters in blocks (where the
per-gradient work is everything), in interleaved rounds in one process so that a busy machine slows all
three alike. A bench, not a test: its figures go to docs/PERFORMANCE.md.

    /usr/bin/python3 scripts/dp_cpu_cost.py [--blocks 75] [--rounds 7] [--steps 40] [--out results.json]

Each round times `--steps` steps of each level (forward, backward, SGD step) and takes the median step;
the extra host time per gradient is (wrapper's step - plain step) / parameter tensors, per round, and the
result is the median over rounds with the spread. It also counts how often a backward enters ferry's
Python (a profiler's function calls into the ferry package), and checks that every level's gradients
equal plain training's (world size 1: the average is the gradient itself).
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import ferry
import ferry.torch


class Blocks(torch.nn.Module):
    """`blocks` residual blocks of two small linear layers (four parameter tensors each) and a head."""

    def __init__(self, blocks: int, width: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width))
            for _ in range(blocks))
        self.head = torch.nn.Linear(width, 2)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def ferry_calls_per_backward(model, x) -> int:
    root = str(Path(ferry.__file__).resolve().parent)
    calls = 0

    def profile(frame, event, _arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls += 1

    loss = model(x).square().mean()
    sys.setprofile(profile)
    try:
        loss.backward()
    finally:
        sys.setprofile(None)
    return calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=75, help="blocks of four parameter tensors (75: 302 tensors)")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--set-to-none", action="store_true", help="zero_grad(set_to_none=True) (default: False)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)

    torch.manual_seed(0)
    base = Blocks(args.blocks, args.width)
    n_params = len(list(base.parameters()))
    models = {"plain": copy.deepcopy(base),
              "ddp": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=100,
                                                               gradient_as_bucket_view=True, static_graph=True),
              "ferry": ferry.torch.DataParallel(copy.deepcopy(base), plan="fixed")}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1))

    def step(level: str) -> None:
        m, opt = models[level], opts[level]
        opt.zero_grad(set_to_none=args.set_to_none)
        m(x).square().mean().backward()
        opt.step()

    # Warm up (DDP's static graph and ferry's first step rebuild their buckets), then check the gradients.
    for _ in range(5):
        for level in models:
            step(level)
    grads = {k: [q.grad.clone() for q in m.parameters()] for k, m in models.items()}
    for level in ("ddp", "ferry"):
        for a, b in zip(grads["plain"], grads[level]):
            assert torch.allclose(a, b, atol=1e-6), f"{level}'s gradients differ from plain training's"
    calls = {"ddp": None, "ferry": ferry_calls_per_backward(models["ferry"], x)}
    for m in models.values():
        m.zero_grad()

    per_round = {k: [] for k in models}
    for _ in range(args.rounds):
        for level in models:  # interleaved: the same load on each
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step(level)
                times.append(time.perf_counter() - t)
            per_round[level].append(statistics.median(times))
    rows = []
    for level in models:
        extra = [(w - p) / n_params * 1e6 for w, p in zip(per_round[level], per_round["plain"])]
        rows.append({"level": level, "step_us": statistics.median(per_round[level]) * 1e6,
                     "step_us_rounds": [t * 1e6 for t in per_round[level]],
                     "extra_us_per_gradient": statistics.median(extra), "extra_us_per_gradient_min": min(extra),
                     "extra_us_per_gradient_max": max(extra),
                     "extra_us_per_step": statistics.median(extra) * n_params,
                     "ferry_python_calls_per_backward": calls.get(level)})
    print(f"{n_params} parameter tensors, width {args.width}, batch {args.batch}, torch {torch.__version__}, "
          f"world size 1, {args.rounds} interleaved rounds of {args.steps} steps, "
          f"set_to_none={args.set_to_none}")
    print("level  step us  extra us/gradient (min..max over rounds)  extra us/step  ferry Python calls/backward")
    for r in rows:
        print(f"{r['level']:<6} {r['step_us']:8.1f} {r['extra_us_per_gradient']:8.2f} "
              f"({r['extra_us_per_gradient_min']:.2f}..{r['extra_us_per_gradient_max']:.2f}) "
              f"{r['extra_us_per_step']:22.1f}  {r['ferry_python_calls_per_backward']}")
    models["ferry"].close()
    dist.destroy_process_group()
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump({"params": n_params, "torch": torch.__version__, "args": vars(args), "rows": rows}, f,
                      indent=1)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
