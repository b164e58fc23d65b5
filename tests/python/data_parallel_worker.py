"""One rank of a ferry.torch.DataParallel job on CPU tensors (ferry's host backend), for
test_data_parallel.py: `python data_parallel_worker.py SCENARIO RANK WORLD PORT OUT`. Every rank trains
the same small model on its slice of a fixed global batch; the scenario picks what else happens. The rank
writes a JSON report to OUT (its parameters, the errors it saw) and exits 0, or exits non-zero where the
scenario says so."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import ferry.torch

SCENARIO, RANK, WORLD, PORT, OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
STEPS = 6
BATCH = 4  # per rank


def model_of(seed: int, unused: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
              torch.nn.Linear(32, 3)]
    m = torch.nn.Sequential(*layers)
    if unused:
        m.add_module("unused", torch.nn.Linear(4, 4))
    return m


class Unused(torch.nn.Module):
    """A model with a layer forward never calls."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.body = model_of(seed)
        torch.manual_seed(seed + 1)
        self.head_b = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.body(x)


def data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(STEPS, WORLD * BATCH, 8, generator=g)
    y = torch.randint(0, 3, (STEPS, WORLD * BATCH), generator=g)
    return x, y


def report(**fields) -> None:
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(fields, f)
    os.replace(tmp, OUT)


def params_of(m) -> list:
    return [p.detach().float().reshape(-1).tolist() for p in m.parameters()]


def main() -> int:
    # nccl: one GPU per rank, torch's own NCCL group beside ferry's (its collectives between the steps).
    nccl = SCENARIO == "nccl"
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK,
                            world_size=WORLD)
    x, y = data()
    if nccl:
        torch.cuda.set_device(RANK)
        x, y = x.cuda(), y.cuda()
    lo, hi = RANK * BATCH, (RANK + 1) * BATCH
    loss_fn = torch.nn.CrossEntropyLoss()
    # killed: the others learn only at the timeout; raise: the failing rank tells them when it exits, well
    # before this timeout even on a loaded machine.
    timeout = {"killed": 5.0, "raise": 40.0}.get(SCENARIO, 60.0)

    if SCENARIO in ("unused", "unused_allowed"):
        model = ferry.torch.DataParallel(Unused(seed=10 + RANK), plan="fixed", timeout=timeout,
                                         find_unused_parameters=SCENARIO == "unused_allowed")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            for s in range(2):
                opt.zero_grad()
                loss_fn(model(x[s, lo:hi]), y[s, lo:hi]).backward()
                opt.step()
        except RuntimeError as e:
            report(error=str(e))
            return 0
        report(params=params_of(model.module), error=None)
        return 0

    if SCENARIO.startswith("hook_"):
        # torch's DDP with ferry's comm hook: DDP's buckets, ferry's reduction.
        codec = SCENARIO[len("hook_"):]
        ddp = torch.nn.parallel.DistributedDataParallel(model_of(seed=10 + RANK), bucket_cap_mb=0.002)
        ddp.register_comm_hook(None, ferry.torch.comm_hook(codec, device="cpu"))  # the model's device
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for s in range(STEPS):
            opt.zero_grad()
            loss_fn(ddp(x[s, lo:hi]), y[s, lo:hi]).backward()
            opt.step()
        report(params=params_of(ddp.module), error=None)
        return 0

    # Different initial parameters per rank: DataParallel starts every rank from rank 0's.
    plan = "auto" if SCENARIO == "auto" else "fixed"
    small = SCENARIO != "one_bucket"  # several buckets, or every gradient counted into one
    module = model_of(seed=10 + RANK)
    if nccl:
        module = module.cuda()
    if SCENARIO.startswith("bf16"):
        # Pure low-precision training: bf16 parameters and gradients, averaged in bf16 or widened to f32.
        module = module.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
    model = ferry.torch.DataParallel(module, plan=plan, learn_steps=1, timeout=timeout,
                                     bucket_cap_mb=0.002 if small else 25, first_bucket_mb=0.001 if small else 25,
                                     reduce_dtype=torch.float32 if SCENARIO == "bf16_f32" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    initial = params_of(model.module)
    losses = []
    try:
        for s in range(STEPS):
            if SCENARIO != "zero_after_forward":
                opt.zero_grad(set_to_none=(s % 2 == 1))  # both ways of zeroing: the views stay in place
            if SCENARIO == "no_sync":
                half = BATCH // 2
                with model.no_sync():
                    loss_fn(model(x[s, lo:lo + half]), y[s, lo:lo + half]).mul(0.5).backward()
                loss = loss_fn(model(x[s, lo + half:hi]), y[s, lo + half:hi]).mul(0.5)
            elif SCENARIO == "autocast":
                # Mixed precision: bf16 compute under autocast, float32 parameters and gradients.
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    loss = loss_fn(model(x[s, lo:hi]), y[s, lo:hi])
            else:
                loss = loss_fn(model(x[s, lo:hi]), y[s, lo:hi])
            if SCENARIO == "grad_then_zero":
                # An input gradient first (adversarial training's pattern), then the optimizer drops the
                # gradients and the step's own backward follows.
                xr = x[s, lo:hi].clone().requires_grad_()
                torch.autograd.grad(model(xr).sum(), xr)
                opt.zero_grad(set_to_none=True)
            if SCENARIO == "zero_after_forward":
                # As pytorch/examples' imagenet loop: the gradients dropped between forward and backward.
                opt.zero_grad(set_to_none=True)
            loss.backward()
            if nccl:
                # torch's NCCL group between ferry's backward and the optimizer, as a loss average is.
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                mean /= WORLD
            opt.step()
            losses.append(loss.item())
            if SCENARIO == "raise" and RANK == 1 and s == 2:
                raise ValueError("rank 1 fails in its training loop")
            if SCENARIO == "killed" and RANK == 1 and s == 2:
                os._exit(9)
    except RuntimeError as e:
        report(error=str(e), failed_at=s, when=time.time())
        return 0
    report(initial=initial, params=params_of(model.module), stats=model.stats(), error=None, losses=losses)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
