"""What the data-parallel benches of one GPU share (dp_host_breakdown.py, dp_graph.py, dp_compile.py): a
group of one over NCCL and its device, and a results file written whole."""
import json
import os


def one_gpu(port: int):
    """torch.distributed's NCCL group of this process alone (as torchrun's world size 1), and GPU 0."""
    import torch
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    return dev


def write_json(path: str, doc) -> None:
    """`doc` at `path`, appearing under that name only when complete."""
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)
