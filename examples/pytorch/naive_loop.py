"""A naive PyTorch training loop, profiled with torch.profiler (Kineto), for `ferry analyze`.

Each step the main thread makes a batch of random images on the CPU, copies it to the GPU from
pageable memory, runs a small convolutional model forward and backward, and reads the loss back with
.item(). This is the ingest ladder's L0: the GPU idles while the CPU makes the batch.

    python3 examples/pytorch/naive_loop.py --out naive.json [--variant naive|prefetch]

`--variant prefetch` is the same model fed by a pinned, non-blocking copy on a side stream one batch
ahead, with the batches made before the loop: the fixed loop, for checking that the analyzer stays quiet.
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--variant", choices=["naive", "prefetch"], default="naive")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=256)
    a = p.parse_args()
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    shape = (a.batch, 3, a.size, a.size)
    wait, warmup, active = 1, 2, 5
    total = wait + warmup + active
    side = torch.cuda.Stream()
    if a.variant == "prefetch":
        host = [torch.rand(shape).pin_memory() for _ in range(2)]
        labels = torch.randint(0, 10, (a.batch,)).pin_memory()
        with torch.cuda.stream(side):
            nxt = host[0].cuda(non_blocking=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=wait, warmup=warmup, active=active)) as prof:
        for step in range(total):
            if a.variant == "naive":
                with record_function("make batch"):
                    x_cpu = torch.rand(shape)
                    y_cpu = torch.randint(0, 10, (a.batch,))
                x = x_cpu.cuda()
                y = y_cpu.cuda()
            else:
                torch.cuda.current_stream().wait_stream(side)
                x = nxt
                x.record_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    nxt = host[(step + 1) % 2].cuda(non_blocking=True)
                y = labels.cuda(non_blocking=True)
            with record_function("train step"):
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
            if a.variant == "naive":
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            prof.step()
    torch.cuda.synchronize()
    prof.export_chrome_trace(a.out)


if __name__ == "__main__":
    main()
