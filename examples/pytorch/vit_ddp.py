"""Data-parallel training of a real ViT-L/32 over the GPUs of one machine: PyTorch's DistributedDataParallel
(DDP) at its usual settings beside ferry.torch.DataParallel, in one run, with one GPU alone as the ceiling.

torchvision's vit_l_32 (random weights, 306M parameters, 1.22 GB of fp32 gradients) trains with SGD (lr 1e-3,
momentum 0.9) and cross-entropy over 1000 classes on batches of 32 images of 3x224x224 float32 per GPU,
channels first, no autocast unless --amp (bf16). The data is synthetic: made on the device once, from a
fixed seed that differs per rank, and reused every step, so every level measures the model and the
gradient exchange, never a loader. Levels, each in the same run, each a fresh model from the same seed:

  single        one GPU alone, no data parallelism: rank 0 trains while the other ranks wait at a barrier.
                The ceiling: data parallelism at best hides all of its communication behind the backward
                pass and costs nothing else.
  ddp25         DDP, 25 MB gradient buckets (PyTorch's default)
  ddp100        DDP, 100 MB buckets (the best bucket size measured on an NVLink pair)
  ddp25_view    DDP, 25 MB, gradient_as_bucket_view=True + static_graph=True (no copy of each gradient
                into its bucket; the graph's ready order learnt once)
  ddp100_view   DDP, 100 MB, gradient_as_bucket_view=True + static_graph=True (DDP's best setting here)
  ddp_bf16      DDP, 100 MB + views + static graph, bf16_compress_hook: each bucket cast to bf16 for the
                all-reduce and back (half the bytes on the wire, a cast on each side)
  ddp_powersgd  DDP, 100 MB, PowerSGD rank 1 with error feedback, compressing from step 2 (within warm-up)
  ferry         ferry.torch.DataParallel(plan="auto", lossy=False): ferry picks its bucket plan from what
                it measures during the first steps; fp32 on the wire
  ferry_lossy   ferry.torch.DataParallel(plan="auto", lossy=True): the plan may cast buckets to 16 bits
                where the link is slow enough for that to pay

Why the warm-up is long (--warmup, default 15): ferry's automatic plan learns for 1 + 3*3 = 10 steps
(one step to see the gradients' ready order, then three candidate plans timed three steps each) and
freezes its choice after that, so a level timed sooner would time the learning. Every level gets the
same warm-up (DDP's first steps also build its buckets, PowerSGD starts at step 2), then --steps (30)
timed steps.

How a level is timed: all ranks synchronize their device and meet at a barrier; each records CUDA events
around its timed steps and synchronizes after them; each rank's elapsed time is gathered and the level's
figure is steps / the slowest rank's time (a data-parallel step is only done when every rank is). Ratios:
`x single` = steps/s / the same run's `single`; `x best DDP` = steps/s / the fastest DDP level of the
same run (so the best DDP row reads 1.000 and ferry's row says what it gains over tuned DDP).

    torchrun --nproc_per_node 2 examples/pytorch/vit_ddp.py --levels all --out vit-out
    torchrun --nproc_per_node 2 examples/pytorch/vit_ddp.py --levels single,ddp100_view,ferry \
        --profile ferry --out vit-out
    torchrun --nproc_per_node 2 examples/pytorch/vit_ddp.py --convergence 300 --model vit_b_32 --out conv-out
    # no GPU (gloo): a smoke run of every code path at a tiny size
    torchrun --nproc_per_node 2 examples/pytorch/vit_ddp.py --device cpu --model tiny --batch 4 --steps 2 --warmup 1

--out DIR writes DIR/results.json (every level, the configuration, torch/NCCL versions, the GPU, NCCL_*
environment; it appears only when complete). A level whose requirement is missing here (ferry's
DataParallel not importable, a backend without bf16) is reported as "skipped: <why>", never as a number.
`--profile LEVEL` writes a PyTorch profiler trace (Chrome JSON) of 5 more steps of that level per rank,
DIR/trace_<level>_rank<r>.json, for `ferry analyze`. `--convergence N` trains N steps of `ddp` (fp32, 100 MB),
`ferry` and `ferry_lossy` instead of timing, records rank 0's loss per step and prints each curve's largest
relative difference to DDP's. Without torchrun (no WORLD_SIZE in the environment) the script runs as one
process, world size 1.
"""
import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import shlex
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# ---- levels --------------------------------------------------------------------------------------

LEVELS = {
    "single": "one GPU alone, no data parallelism (the other ranks wait): the ceiling",
    "ddp25": "DDP, 25 MB buckets (PyTorch's default)",
    "ddp100": "DDP, 100 MB buckets",
    "ddp25_view": "DDP, 25 MB, gradient_as_bucket_view + static_graph",
    "ddp100_view": "DDP, 100 MB, gradient_as_bucket_view + static_graph",
    "ddp_bf16": "DDP, 100 MB + views + static_graph, bf16_compress_hook",
    "ddp_powersgd": "DDP, 100 MB, PowerSGD rank 1 (error feedback, from step 2)",
    "ferry": "ferry.torch.DataParallel, plan auto, lossless",
    "ferry_lossy": "ferry.torch.DataParallel, plan auto, lossy codecs allowed",
    "ferry_f32": "ferry.torch.DataParallel, plan auto, 16-bit gradients averaged in float32 (--param-dtype)",
}
# The convergence run's reference: DDP at fp32 with 100 MB buckets and nothing else changed.
CONVERGENCE_LEVELS = {"ddp": "DDP, fp32, 100 MB buckets (the reference curve)",
                      **{k: v for k, v in LEVELS.items() if k != "single"}}
CONVERGENCE_DEFAULT = "ddp,ferry,ferry_lossy"

# DDP's settings per level: bucket size (MB), gradient_as_bucket_view + static_graph, communication hook.
DDP_LEVELS = {
    "ddp": dict(bucket_cap_mb=100, views=False, hook=None),
    "ddp25": dict(bucket_cap_mb=25, views=False, hook=None),
    "ddp100": dict(bucket_cap_mb=100, views=False, hook=None),
    "ddp25_view": dict(bucket_cap_mb=25, views=True, hook=None),
    "ddp100_view": dict(bucket_cap_mb=100, views=True, hook=None),
    "ddp_bf16": dict(bucket_cap_mb=100, views=True, hook="bf16"),
    "ddp_powersgd": dict(bucket_cap_mb=100, views=False, hook="powersgd"),
}
FERRY_LEVELS = {"ferry": dict(lossy=False), "ferry_lossy": dict(lossy=True),
                "ferry_f32": dict(lossy=False, reduce_dtype=torch.float32)}
POWERSGD_START_ITER = 2  # PowerSGD all-reduces plainly before this step, compresses from it on

# ferry's automatic plan: 1 step to learn the gradients' ready order + 3 candidate plans x 3 steps each.
FERRY_LEARNING_STEPS = 1 + 3 * 3
MIN_WARMUP = 15  # the warm-up every level gets by default: ferry's learning and then some

PROFILE_STEPS = 5

MODELS = ("vit_l_32", "vit_b_32", "tiny", "tiny_pure")


class Skip(Exception):
    """A level whose requirement is missing on this machine: reported as "skipped: <why>"."""


# ---- arguments -----------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default=None,
                   help=f"comma-separated levels or 'all' (default: all; with --convergence "
                        f"{CONVERGENCE_DEFAULT}). Known: {','.join(LEVELS)}")
    p.add_argument("--steps", type=int, default=30, help="timed steps per level (default 30)")
    p.add_argument("--warmup", type=int, default=MIN_WARMUP,
                   help=f"untimed steps before them (default {MIN_WARMUP}; ferry's plan learns for "
                        f"{FERRY_LEARNING_STEPS} steps, so keep it >= {MIN_WARMUP} for a ferry figure)")
    p.add_argument("--model", default="vit_l_32", choices=MODELS,
                   help="vit_l_32 (default), vit_b_32, tiny (torchvision VisionTransformer of 2 layers, width 64, "
                        "10 classes; the pure-torch one where torchvision is missing) or tiny_pure (always "
                        "the pure-torch one)")
    p.add_argument("--image-size", type=int, default=None, help="square image side (default 224; tiny: 32)")
    p.add_argument("--batch", type=int, default=32, help="images per GPU per step (default 32)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0, help="model and data seed (rank r's data: seed + 1 + r)")
    p.add_argument("--amp", action="store_true", help="bf16 autocast around the forward pass and the loss")
    p.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the parameters' dtype: float32 (default), or pure low-precision training (the model and "
                        "the images cast to it; gradients of that dtype)")
    p.add_argument("--accumulate", type=int, default=1,
                   help="micro-batches per optimizer step; all but the last inside no_sync() (default 1)")
    p.add_argument("--data-batches", type=int, default=None,
                   help="distinct batches per rank, cycled (default 1; with --convergence 8)")
    p.add_argument("--device", default="cuda", help="cuda (default; one GPU per rank) or cpu (gloo)")
    p.add_argument("--out", default=None, help="folder for results.json (and --profile's traces)")
    p.add_argument("--profile", default=None, metavar="LEVEL[,LEVEL...]",
                   help=f"after timing each LEVEL, trace {PROFILE_STEPS} more of its steps with torch.profiler "
                        "into OUT/trace_<level>_rank<r>.json (the profiler can slow the levels after it in the "
                        "same run: time the ladder in a run without it)")
    p.add_argument("--convergence", type=int, default=0, metavar="N",
                   help="instead of timing: train N steps per level, record rank 0's loss per step and "
                        "compare each curve with DDP's")
    p.add_argument("--tolerance", type=float, default=None,
                   help="with --convergence: exit 1 when a lossless level's (ferry, ddp*) curve differs from "
                        "the reference by more than this relative amount at any step")
    p.add_argument("--timeout-s", type=int, default=900,
                   help="process group timeout: how long a rank waits for a peer that failed (default 900)")
    args = p.parse_args(argv)

    def bad(msg):
        p.error(msg)

    if args.device not in ("cuda", "cpu"):
        bad(f"--device {args.device!r}: expected cuda or cpu")
    for name in ("steps", "batch", "accumulate"):
        if getattr(args, name) < 1:
            bad(f"--{name} {getattr(args, name)}: expected 1 or more")
    if args.warmup < 0:
        bad(f"--warmup {args.warmup}: expected 0 or more")
    if args.convergence < 0:
        bad(f"--convergence {args.convergence}: expected a number of steps")
    if args.data_batches is None:
        args.data_batches = 8 if args.convergence else 1
    if args.data_batches < 1:
        bad(f"--data-batches {args.data_batches}: expected 1 or more")
    if args.image_size is None:
        args.image_size = 32 if args.model.startswith("tiny") else 224
    patch = 8 if args.model.startswith("tiny") else 32
    if args.image_size < patch or args.image_size % patch:
        bad(f"--image-size {args.image_size}: {args.model} needs a multiple of its patch size {patch}")

    known = CONVERGENCE_LEVELS if args.convergence else LEVELS
    text = args.levels or (CONVERGENCE_DEFAULT if args.convergence else "all")
    chosen = list(known) if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        bad(f"--levels {text!r}: unknown level(s) {unknown}; known{' with --convergence' if args.convergence else ''}: "
            f"{','.join(known)}")
    if len(set(chosen)) != len(chosen):
        bad(f"--levels {text!r}: a level named twice")
    args.level_list = chosen
    if args.profile is not None:
        if args.convergence:
            bad("--profile times nothing with --convergence: give one or the other")
        args.profile_list = [s.strip() for s in args.profile.split(",") if s.strip()]
        if not args.profile_list or any(p not in chosen for p in args.profile_list):
            bad(f"--profile {args.profile!r}: not among the levels run ({','.join(chosen)})")
        if not args.out:
            bad("--profile needs --out DIR for its traces")
    return args


# ---- the process group ---------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """This process's place in the job: rank, world size, device, and a gloo group for the script's own
    barriers and gathers (CPU-side, so a rank that waits costs its GPU nothing and a level's timing sees
    no NCCL call that is not the level's own)."""

    def __init__(self, args):
        if "WORLD_SIZE" not in os.environ:  # not under torchrun: one process, world size 1
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(_free_port()))
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        if args.device == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit("--device cuda: torch.cuda.is_available() is False; use --device cpu")
            if self.local_rank >= torch.cuda.device_count():
                raise SystemExit(f"rank {self.rank}: local rank {self.local_rank} but only "
                                 f"{torch.cuda.device_count()} GPUs visible")
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            self.backend = "nccl"
        else:
            self.device = torch.device("cpu")
            self.backend = "gloo"
        timeout = datetime.timedelta(seconds=args.timeout_s)
        dist.init_process_group(self.backend, timeout=timeout)
        self.ctrl = dist.new_group(backend="gloo", timeout=timeout)
        self.is_cuda = self.device.type == "cuda"

    @property
    def leader(self):
        return self.rank == 0

    def barrier(self):
        dist.barrier(group=self.ctrl)

    def gather(self, obj):
        """Every rank's obj, in rank order, on every rank."""
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.ctrl)
        return out

    def synchronize(self):
        if self.is_cuda:
            torch.cuda.synchronize()

    def close(self):
        dist.destroy_process_group()


def log(ranks, msg):
    if ranks.leader:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- model and data ------------------------------------------------------------------------------

TINY = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128, num_classes=10)


class PureViT(nn.Module):
    """A small Vision Transformer in plain torch, the shape of torchvision's VisionTransformer (patch
    embedding by a strided convolution, class token, learnt position embedding, pre-norm encoder layers,
    a linear head on the class token), for machines without torchvision."""

    def __init__(self, image_size, patch_size, num_layers, num_heads, hidden_dim, mlp_dim, num_classes):
        super().__init__()
        self.patch = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        tokens = (image_size // patch_size) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.pos = nn.Parameter(torch.randn(1, tokens, hidden_dim) * 0.02)
        layer = nn.TransformerEncoderLayer(hidden_dim, num_heads, mlp_dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.head = nn.Linear(hidden_dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)  # (batch, patches, hidden)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


def have_torchvision():
    try:
        import torchvision  # noqa: F401
        return True
    except ImportError:
        return False


def model_impl(args):
    """Which implementation --model builds here (recorded in results.json)."""
    if args.model == "tiny_pure" or (args.model == "tiny" and not have_torchvision()):
        return "pure-torch ViT (examples/pytorch/vit_ddp.py PureViT)"
    from torchvision import __version__
    return f"torchvision {__version__}"


def num_classes(args):
    return TINY["num_classes"] if args.model.startswith("tiny") else 1000


PARAMETERS = {}  # --model -> its parameter count, once a level has built it


def build_model(args, device):
    """A fresh model from args.seed, in training mode on `device`: every level and every rank starts
    from the same weights."""
    torch.manual_seed(args.seed)
    if args.model.startswith("tiny"):
        cfg = dict(TINY, image_size=args.image_size)
        if "pure" in model_impl(args):
            model = PureViT(**cfg)
        else:
            from torchvision.models import VisionTransformer
            model = VisionTransformer(**cfg)
    else:
        import torchvision.models as tvm
        model = getattr(tvm, args.model)(weights=None, image_size=args.image_size)
    PARAMETERS[args.model] = sum(p.numel() for p in model.parameters())
    return model.train().to(device=device, dtype=getattr(torch, args.param_dtype))


def make_data(args, ranks):
    """args.data_batches batches of (images, labels) made on the device once, from seed + 1 + rank: each
    rank sees different data, every level the same."""
    g = torch.Generator(device=ranks.device)
    g.manual_seed(args.seed + 1 + ranks.rank)
    shape = (args.batch, 3, args.image_size, args.image_size)
    return [(torch.randn(shape, generator=g, device=ranks.device).to(getattr(torch, args.param_dtype)),
             torch.randint(0, num_classes(args), (args.batch,), generator=g, device=ranks.device))
            for _ in range(args.data_batches)]


# ---- the levels' wrappers ------------------------------------------------------------------------

def check_level(name, args, ranks):
    """Raises Skip when `name` cannot run here. Every rank decides the same way (same software, and the
    one probe below is a collective), so the ranks never disagree on which levels run."""
    low = args.param_dtype != "float32"
    if low and name in ("ddp_bf16", "ddp_powersgd", "ferry_lossy"):
        raise Skip(f"its codec compresses float32 gradients; these are {args.param_dtype}")
    if not low and name == "ferry_f32":
        raise Skip("float32 parameters: their gradients are averaged in float32 at level ferry")
    if name == "ddp_bf16" or (low and name in DDP_LEVELS):
        if ranks.backend == "nccl":
            if not torch.cuda.is_bf16_supported():
                raise Skip("this GPU has no bf16")
        else:  # gloo all-reduces 16-bit types only in newer torch: ask it
            probe = torch.bfloat16 if name == "ddp_bf16" else getattr(torch, args.param_dtype)
            try:
                dist.all_reduce(torch.zeros(1, dtype=probe), group=ranks.ctrl)
            except RuntimeError as e:
                raise Skip(f"DDP needs a backend that all-reduces {probe}; gloo in torch {torch.__version__} "
                           f"does not ({e})") from None
    if args.accumulate > 1 and DDP_LEVELS.get(name, {}).get("views"):
        # The first backward under no_sync() trips an internal assert with static_graph=True, and with that
        # unblocked the reducer stops all-reducing from the second step (pytorch/pytorch#143580, #187732).
        raise Skip("DDP(static_graph=True) breaks under no_sync() (pytorch/pytorch#143580); "
                   "give --accumulate 1")
    if name in FERRY_LEVELS:
        try:
            import ferry.torch
        except Exception as e:  # noqa: BLE001 -- no package, no library: why goes into the row
            raise Skip(f"ferry.torch is not importable: {type(e).__name__}: {e}") from None
        if not hasattr(ferry.torch, "DataParallel"):
            raise Skip("this ferry has no ferry.torch.DataParallel")


def wrap(name, model, args, ranks):
    """The data-parallel wrapper of level `name` around `model`: (wrapped, no_sync or None, close)."""
    if name == "single":
        return model, None, lambda: None
    if name in DDP_LEVELS:
        from torch.nn.parallel import DistributedDataParallel as DDP
        cfg = DDP_LEVELS[name]
        ddp = DDP(model, device_ids=[ranks.local_rank] if ranks.is_cuda else None,
                  bucket_cap_mb=cfg["bucket_cap_mb"], gradient_as_bucket_view=cfg["views"],
                  static_graph=cfg["views"])
        if cfg["hook"] == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)  # None: the default group
        elif cfg["hook"] == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
            if not ranks.is_cuda and tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 0):
                raise Skip("PowerSGD's hook synchronizes a CUDA device after each bucket (torch 2.x): it needs "
                           "a GPU")
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                start_powerSGD_iter=POWERSGD_START_ITER)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp, ddp.no_sync, lambda: None
    if name in FERRY_LEVELS:
        import ferry.torch
        cfg = FERRY_LEVELS[name]
        extra = {"reduce_dtype": cfg["reduce_dtype"]} if "reduce_dtype" in cfg else {}
        dp = ferry.torch.DataParallel(model, plan="auto", lossy=cfg["lossy"], **extra)
        return dp, dp.no_sync, dp.close
    raise AssertionError(name)


def train_step(wrapped, no_sync, opt, data, step, args, ranks):
    """One optimizer step: args.accumulate micro-batches (all but the last inside no_sync(), so gradients
    are exchanged once a step), SGD. Returns the last micro-batch's loss (a device tensor, no sync)."""
    opt.zero_grad(set_to_none=True)
    for micro in range(args.accumulate):
        x, y = data[(step * args.accumulate + micro) % len(data)]
        quiet = no_sync() if no_sync is not None and micro < args.accumulate - 1 else contextlib.nullcontext()
        with quiet:
            with torch.autocast(device_type=ranks.device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = F.cross_entropy(wrapped(x), y)
            loss.backward()
    opt.step()
    return loss.detach()


def ferry_stats(wrapped):
    """model.stats() of a ferry wrapper, made JSON-safe; None for the other levels."""
    if not hasattr(wrapped, "stats"):
        return None
    try:
        return json.loads(json.dumps(wrapped.stats(), default=str))
    except Exception as e:  # noqa: BLE001 -- a statistic is not worth a level
        return {"error": f"{type(e).__name__}: {e}"}


def release():
    """Hands a finished level's memory back before the next level (its caller dropped its references)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- timing --------------------------------------------------------------------------------------

class Timer:
    """Elapsed seconds of the steps between start() and stop(): CUDA events on the current stream (the
    device's time; the host synchronizes before and after), or the wall clock on the CPU."""

    def __init__(self, ranks):
        self.ranks = ranks
        if ranks.is_cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self):
        self.ranks.synchronize()
        self.t0 = time.perf_counter()
        if self.ranks.is_cuda:
            self.begin.record()

    def stop(self):
        if self.ranks.is_cuda:
            self.end.record()
        self.ranks.synchronize()
        wall = time.perf_counter() - self.t0
        return (self.begin.elapsed_time(self.end) / 1e3 if self.ranks.is_cuda else wall), wall


def profile_steps(name, wrapped, no_sync, opt, data, start, args, ranks):
    """PROFILE_STEPS more steps of a level under torch.profiler, one Chrome trace per rank."""
    from torch.profiler import ProfilerActivity, profile, record_function
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ranks.is_cuda else [])
    path = os.path.join(args.out, f"trace_{name}_rank{ranks.rank}.json")
    with profile(activities=acts) as prof:
        for i in range(PROFILE_STEPS):
            with record_function(f"step {start + i}"):
                train_step(wrapped, no_sync, opt, data, start + i, args, ranks)
        ranks.synchronize()
    prof.export_chrome_trace(path)
    return path


def time_level(name, args, ranks, data):
    """Warm-up + timed steps of one level on every rank; returns what this rank measured. An exception
    is raised only after the closing barrier, so a rank that fails still meets the others there."""
    active = name != "single" or ranks.leader  # single: rank 0 alone, the others wait below
    mine = {"seconds": None, "wall_seconds": None, "peak_memory_bytes": None, "stats": None,
            "stats_before_timing": None, "trace": None}
    failure = None
    if active:
        try:
            run_timed(name, args, ranks, data, mine)
        except Exception as e:  # noqa: BLE001 -- re-raised below, after the barrier
            failure = e
    ranks.barrier()  # single: where the other ranks waited
    if failure is not None:
        raise failure
    return mine


def run_timed(name, args, ranks, data, mine):
    model = build_model(args, ranks.device)
    wrapped, close = model, (lambda: None)
    opt = None
    try:
        wrapped, no_sync, close = wrap(name, model, args, ranks)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        if ranks.is_cuda:
            torch.cuda.reset_peak_memory_stats()
        for step in range(args.warmup):
            train_step(wrapped, no_sync, opt, data, step, args, ranks)
        mine["stats_before_timing"] = ferry_stats(wrapped)
        timer = Timer(ranks)
        if name != "single":
            ranks.synchronize()  # the warm-up done here, then on every rank: the timed steps start together
            ranks.barrier()
        timer.start()
        for step in range(args.warmup, args.warmup + args.steps):
            train_step(wrapped, no_sync, opt, data, step, args, ranks)
        mine["seconds"], mine["wall_seconds"] = timer.stop()
        if ranks.is_cuda:
            mine["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        mine["stats"] = ferry_stats(wrapped)
        if args.profile is not None and name in args.profile_list:
            mine["trace"] = profile_steps(name, wrapped, no_sync, opt, data, args.warmup + args.steps, args, ranks)
    finally:
        close()
        del wrapped, model, opt
        release()


def converge_level(name, args, ranks, data):
    """args.convergence steps of one level; rank 0's loss per step (kept on the device until the end)."""
    model = build_model(args, ranks.device)
    wrapped, close = model, (lambda: None)
    opt = None
    try:
        wrapped, no_sync, close = wrap(name, model, args, ranks)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        losses = torch.empty(args.convergence, device=ranks.device)
        for step in range(args.convergence):
            losses[step] = train_step(wrapped, no_sync, opt, data, step, args, ranks).float()
        return {"losses": losses.tolist(), "stats": ferry_stats(wrapped)}
    finally:
        close()
        del wrapped, model, opt
        release()


def run_level(name, args, ranks, data):
    """One level on every rank: its row (rank 0's view, the same on every rank). A missing requirement
    becomes a skip; an exception on any rank becomes the row's error, and the next level runs."""
    what = CONVERGENCE_LEVELS[name] if args.convergence else LEVELS[name]
    row = {"level": name, "what": what, "status": "ok", "skipped": None, "error": None}
    log(ranks, f"level {name}: {what}")
    try:
        check_level(name, args, ranks)
        mine = (converge_level if args.convergence else time_level)(name, args, ranks, data)
        failure = None
    except Skip as e:
        row.update(status="skipped", skipped=str(e))
        return row
    except Exception as e:  # noqa: BLE001 -- a failed level is reported in its row and the exit code
        mine, failure = None, f"rank {ranks.rank}: {type(e).__name__}: {e}"
        traceback.print_exc()
    everyone = ranks.gather({"failure": failure, "mine": mine})
    failures = [r["failure"] for r in everyone if r["failure"]]
    if failures:
        row.update(status="error", error="; ".join(failures))
        return row
    if args.convergence:
        row.update(steps=args.convergence, losses=everyone[0]["mine"]["losses"],
                   ferry_stats=everyone[0]["mine"]["stats"])
        return row
    per_rank = [r["mine"]["seconds"] for r in everyone]
    timed = [s for s in per_rank if s is not None]  # single: rank 0's alone
    seconds = max(timed)
    peaks = [r["mine"]["peak_memory_bytes"] for r in everyone if r["mine"]["peak_memory_bytes"] is not None]
    first = everyone[0]["mine"]
    row.update(steps=args.steps, warmup=args.warmup, seconds=seconds, seconds_per_rank=per_rank,
               wall_seconds_rank0=first["wall_seconds"], steps_per_s=args.steps / seconds,
               ms_per_step=1e3 * seconds / args.steps, peak_memory_bytes=max(peaks) if peaks else None,
               ranks_timed=len(timed), ferry_stats=first["stats"],
               ferry_stats_before_timing=first["stats_before_timing"],
               traces=[r["mine"]["trace"] for r in everyone if r["mine"]["trace"]] or None)
    if name in FERRY_LEVELS:
        learning = (first["stats_before_timing"] or {}).get("learning")
        if learning or args.warmup < MIN_WARMUP:
            row["note"] = (f"plan {'still learning' if learning else 'maybe unsettled'} when timing began "
                           f"(warm-up {args.warmup} < {MIN_WARMUP})" if args.warmup < MIN_WARMUP
                           else "plan still learning when timing began")
    return row


# ---- ratios, table, results.json -----------------------------------------------------------------

def add_ratios(rows):
    """x_single: steps/s over the same run's `single`; x_best_ddp: over its fastest DDP level. Returns the
    name of that DDP level (None without one)."""
    ok = [r for r in rows if r["status"] == "ok" and "steps_per_s" in r]
    single = next((r for r in ok if r["level"] == "single"), None)
    ddps = [r for r in ok if r["level"] in DDP_LEVELS]
    best = max(ddps, key=lambda r: r["steps_per_s"]) if ddps else None
    for r in ok:
        r["x_single"] = r["steps_per_s"] / single["steps_per_s"] if single else None
        r["x_best_ddp"] = r["steps_per_s"] / best["steps_per_s"] if best else None
    return best["level"] if best else None


def plan_text(stats):
    """ferry's plan in a few words: its buckets (sizes in MiB, first to last) and how many are lossy."""
    plan = (stats or {}).get("plan") or {}
    if not plan:
        return ""
    sizes = plan.get("bucket_bytes")
    if sizes:
        mib = [b / 2**20 for b in sizes]
        shape = f" of {mib[0]:.1f} MiB" if len(mib) == 1 else f" of {min(mib):.1f}-{max(mib):.1f} MiB"
    else:  # a plan given by its first bucket and its cap
        cap = plan.get("bucket_cap_bytes")
        shape = f", cap {cap / 2**20:.0f} MiB" if isinstance(cap, (int, float)) else ""
    learning = ", learning" if stats.get("learning") else ""
    return f"plan: {plan.get('buckets')} buckets{shape}, {plan.get('lossy_buckets', 0)} lossy{learning}"


def print_table(rows, best_ddp, head):
    print(head)
    print(f"{'level':<13} {'steps/s':>8} {'x single':>9} {'x best DDP':>11} {'ms/step':>8}  notes")
    def fmt(v, spec):  # a ratio, or "-" in its width where the run has no single or no DDP level
        return format(v, spec) if v is not None else "-".rjust(int(spec.split(".")[0]))

    for r in rows:
        if r["status"] == "skipped":
            print(f"{r['level']:<13} skipped: {r['skipped']}")
        elif r["status"] == "error":
            print(f"{r['level']:<13} failed: {r['error']}")
        else:
            notes = [n for n in (plan_text(r.get("ferry_stats")), r.get("note"),
                                 "best DDP" if r["level"] == best_ddp else "") if n]
            print(f"{r['level']:<13} {r['steps_per_s']:8.3f} {fmt(r['x_single'], '9.3f')} "
                  f"{fmt(r['x_best_ddp'], '11.3f')} {r['ms_per_step']:8.2f}  {'; '.join(notes)}")


def compare_curves(rows):
    """Each curve's largest relative difference to the reference's (`ddp`, else the first level that
    ran), step by step: max |loss - ref| / |ref|. Returns the reference's name."""
    ok = [r for r in rows if r["status"] == "ok"]
    ref = next((r for r in ok if r["level"] == "ddp"), ok[0] if ok else None)
    for r in ok:
        diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], ref["losses"])]
        r["max_rel_diff"] = max(diffs) if diffs else 0.0
        r["max_rel_diff_step"] = diffs.index(r["max_rel_diff"]) if diffs else None
        r["final_loss"] = r["losses"][-1] if r["losses"] else None
    return ref["level"] if ref else None


def print_curves(rows, ref, head):
    print(head)
    print(f"{'level':<13} {'first loss':>10} {'final loss':>10} {'max rel diff':>13}  (to {ref}, at step)")
    for r in rows:
        if r["status"] == "skipped":
            print(f"{r['level']:<13} skipped: {r['skipped']}")
        elif r["status"] == "error":
            print(f"{r['level']:<13} failed: {r['error']}")
        else:
            print(f"{r['level']:<13} {r['losses'][0]:10.4f} {r['final_loss']:10.4f} "
                  f"{r['max_rel_diff']:13.3e}  step {r['max_rel_diff_step']}")


def environment(args, ranks, model_params):
    gpu = torch.cuda.get_device_name(ranks.device) if ranks.is_cuda else None
    nccl = None
    if ranks.is_cuda:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 -- a version is not worth the run
            pass
    try:
        import torchvision
        tv = torchvision.__version__
    except ImportError:
        tv = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": tv,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "gpu": gpu,
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cpus": os.cpu_count(),
        "backend": ranks.backend,
        "world_size": ranks.world,
        "model_impl": model_impl(args),
        "model_parameters": model_params,
        "gradient_bytes": 4 * model_params if model_params else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "env": {"NCCL_P2P_DISABLE": os.environ.get("NCCL_P2P_DISABLE"),
                **{k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL_"))}},
    }


def write_results(path, doc):
    """path appears only when complete: written under a temporary name, then renamed."""
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


# ---- main ----------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    ranks = Ranks(args)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    data = make_data(args, ranks)
    mode = "convergence" if args.convergence else "timing"
    log(ranks, f"{mode}: {args.model}, batch {args.batch} x {args.image_size}^2 per rank, {ranks.world} ranks "
               f"({ranks.backend}), levels {','.join(args.level_list)}")
    if not args.convergence and args.warmup < MIN_WARMUP and any(n in FERRY_LEVELS for n in args.level_list):
        log(ranks, f"note: --warmup {args.warmup} < {MIN_WARMUP}: ferry's plan learns for {FERRY_LEARNING_STEPS} "
                   "steps, so its rows time the learning")

    rows = [run_level(name, args, ranks, data) for name in args.level_list]

    code = 1 if any(r["status"] == "error" for r in rows) else 0
    env = environment(args, ranks, PARAMETERS.get(args.model))
    params = f" ({env['model_parameters'] / 1e6:.1f}M parameters)" if env["model_parameters"] else ""
    head = (f"{args.model}{params} on {ranks.world} x {env['gpu'] or 'CPU'} ({ranks.backend}"
            f"{', NCCL ' + env['nccl'] if env['nccl'] else ''}, NCCL_P2P_DISABLE={env['env']['NCCL_P2P_DISABLE']}), "
            f"batch {args.batch}/rank, {args.image_size}px, {args.param_dtype} parameters"
            f"{', bf16 autocast' if args.amp else ''}")
    doc = {"mode": mode, **env, "config": {k: v for k, v in vars(args).items()}}
    if args.convergence:
        ref = compare_curves(rows)
        doc["reference"] = ref
        if args.tolerance is not None:
            over = [r["level"] for r in rows if r["status"] == "ok" and not r["level"].endswith(("lossy", "bf16",
                    "powersgd")) and r["max_rel_diff"] > args.tolerance]
            doc["over_tolerance"] = over
            code = code or (1 if over else 0)
        if ranks.leader:
            print_curves(rows, ref, f"{head}; {args.convergence} steps, {args.data_batches} batches/rank cycled")
    else:
        best = add_ratios(rows)
        doc["best_ddp"] = best
        if ranks.leader:
            print_table(rows, best, f"{head}; {args.warmup} warm-up + {args.steps} timed steps")
    doc["levels"] = rows
    doc["exit_code"] = code
    if ranks.leader and args.out:
        write_results(os.path.join(args.out, "results.json"), doc)
        print(f"wrote {os.path.join(args.out, 'results.json')}")
    sys.stdout.flush()
    ranks.barrier()
    ranks.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
