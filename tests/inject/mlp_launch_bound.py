"""A launch-bound training loop (40 x Linear(512) + ReLU, batch 64: hundreds of short kernels a step), the
case where recording every kernel costs the most: `scripts/gpu.sh trace-cost program` runs it plain, under
`ferry trace` and under `ferry trace --lite`, and (variant kineto, `--kineto`) under torch.profiler, which
records the same kernels through the same CUPTI: what PyTorch's own recorder costs on the same loop. Writes {"levels": [{"level": "mlp", "steps_per_s": ...}]} to
--json, as the PyTorch examples do."""
import argparse
import contextlib
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1500)
p.add_argument("--warmup", type=int, default=50)
p.add_argument("--json")
p.add_argument("--kineto", choices=["cuda", "all"],
               help="time the steps inside torch.profiler.profile: its CUDA activities only, or CPU and CUDA")
args = p.parse_args()

layers = []
for _ in range(40):
    layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 512, device="cuda")


def step():
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


for _ in range(args.warmup):
    step()
torch.cuda.synchronize()
profiler = contextlib.nullcontext()
if args.kineto:
    acts = [torch.profiler.ProfilerActivity.CUDA]
    if args.kineto == "all":
        acts.append(torch.profiler.ProfilerActivity.CPU)
    profiler = torch.profiler.profile(activities=acts)
with profiler:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    rate = args.steps / (time.perf_counter() - start)
print(f"mlp: {rate:.1f} steps/s" + (f" (inside torch.profiler, {args.kineto})" if args.kineto else ""))
if args.json:
    with open(args.json, "w") as f:
        json.dump({"levels": [{"level": "mlp", "steps_per_s": rate}]}, f)
