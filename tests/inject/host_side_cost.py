"""What `ferry trace`'s host side costs a training loop's main thread, without a GPU: the blocking-call
wrappers (LD_PRELOAD), the automatic Python ranges (forward, backward, optimizer.step, the DataLoader's
wait and fetch), the writer thread and the launcher's /proc sampler; no CUDA, so no CUPTI. The loop has the
shape of a PyTorch training step: take a DataLoader batch (64 x 192 KiB from a worker process, through
shared memory), forward and backward through 60 small modules, an Adam step, free the batch. Prints and
writes (--json) the main thread's CPU milliseconds per step (time.thread_time) and the wall milliseconds.
Run it plain and under `ferry trace` (and `--python none`, `--block-us 10000000`) in alternating order; the
difference in main-thread CPU is what the host side adds per step (docs/perf/2026-11-28/h100-h200-trace-4)."""
import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--warmup", type=int, default=20)
p.add_argument("--json")
args = p.parse_args()


class Images(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        return torch.empty(3, 256, 256, dtype=torch.uint8)


torch.set_num_threads(1)
model = torch.nn.Sequential(*[m for _ in range(30) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())])
x = torch.randn(8, 64)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
batches = iter(DataLoader(Images(), batch_size=64, num_workers=1, prefetch_factor=4))


def step():
    batch = next(batches)
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    del batch


for _ in range(args.warmup):
    step()
cpu, wall = time.thread_time(), time.perf_counter()
for _ in range(args.steps):
    step()
result = {"main_cpu_ms": (time.thread_time() - cpu) / args.steps * 1e3,
          "wall_ms": (time.perf_counter() - wall) / args.steps * 1e3}
print(json.dumps(result))
if args.json:
    with open(args.json, "w") as f:
        json.dump(result, f)
