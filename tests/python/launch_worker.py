"""A script as a user writes it for torchrun, started by test_launch.py through `python3 -m ferry.launch`:
`launch_worker.py train OUT` trains a step of ferry.torch.DataParallel on rank-different data and writes
each rank's parameters to OUT.<rank>; `launch_worker.py fail` makes rank 1 exit with status 3 while rank 0
waits in a collective for it; `launch_worker.py stubborn OUT` writes its pid to OUT.<rank> and ignores
SIGINT and SIGTERM for ever."""
import json
import os
import signal
import sys
import time

if sys.argv[1] == "stubborn":
    # A rank that ignores SIGINT and SIGTERM (stuck in a collective, say): only SIGKILL ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(f"{sys.argv[2]}.{os.environ['RANK']}.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"{sys.argv[2]}.{os.environ['RANK']}.tmp", f"{sys.argv[2]}.{os.environ['RANK']}")
    while True:
        time.sleep(1)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ferry.torch  # noqa: E402

dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
rank, world = dist.get_rank(), dist.get_world_size()
assert int(os.environ["LOCAL_RANK"]) == rank and int(os.environ["LOCAL_WORLD_SIZE"]) == world
if sys.argv[1] == "fail":
    if rank == 1:
        sys.exit(3)
    dist.barrier()  # never completes: rank 1 is gone; the launcher ends this process
    sys.exit(0)
torch.manual_seed(rank)  # different initial parameters: DataParallel starts every rank from rank 0's
model = ferry.torch.DataParallel(torch.nn.Linear(4, 2), plan="fixed")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.full((3, 4), float(rank + 1))).sum().backward()
opt.step()
with open(f"{sys.argv[2]}.{rank}", "w") as f:
    json.dump({"world": world, "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}, f)
model.close()
dist.destroy_process_group()
