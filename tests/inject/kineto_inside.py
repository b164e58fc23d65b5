"""A CUDA program that runs torch.profiler in the middle of its loop, for `ferry trace` on a GPU machine: 20
steps, 20 inside a torch.profiler session, 20 after. Prints how many CUDA events the profiler got (it must
still get them while ferry records the program) and exits 1 when it got none."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
x = torch.randn(256, 1024, device="cuda")


def step():
    model(x).sum().backward()
    torch.cuda.synchronize()


for _ in range(20):
    step()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        step()
cuda_events = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
for _ in range(20):
    step()
print(f"torch.profiler CUDA events: {cuda_events}")
sys.exit(0 if cuda_events > 0 else 1)
