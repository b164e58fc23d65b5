"""What the data-parallel benches of one GPU share (dp_host_breakdown.py, dp_graph.py, dp_compile.py,
dp_interleaved.py): a group of one over NCCL and its device, a fixed batch of images, and a results file
written whole."""
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


def images(batch: int, dtype, dev):
    """A fixed batch of ImageNet-shaped inputs and labels on `dev` (seed 0), the inputs of `dtype`."""
    import torch
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, device=dev, generator=g).to(dtype)
    y = torch.randint(0, 1000, (batch,), device=dev, generator=g)
    return x, y


def write_json(path: str, doc) -> None:
    """`doc` at `path`, appearing under that name only when complete."""
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)
