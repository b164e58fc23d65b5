"""examples/pytorch/vit_ddp.py at a tiny size on the CPU: two processes over gloo, as torchrun starts them.
Every requested level ends as a number or a stated skip, results.json holds the run's configuration and
environment, --profile writes one trace per rank, and ferry's rows (through a stand-in with
ferry.torch.DataParallel's interface, so the plumbing is checked whatever state the real one is in) carry
their plan and warm-up note; --convergence records and compares loss curves.

The two processes are started here with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT): Debian's torch 1.13 torch.distributed.run fails on Python 3.11 before starting anything (its
Std flag enum finds no member for "0", so `--redirects` defaults to None)."""
import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "pytorch"
SCRIPT = EXAMPLES / "vit_ddp.py"
sys.path.insert(0, str(EXAMPLES))

SMOKE = ["--device", "cpu", "--model", "tiny", "--image-size", "32", "--batch", "4", "--steps", "2", "--warmup", "1"]

# ferry.torch.DataParallel's interface over DDP: what the example needs of it, with a plan to report.
STAND_IN = '''
import runpy, sys
import torch, ferry.torch
from torch.nn.parallel import DistributedDataParallel as DDP

class DataParallel(torch.nn.Module):
    def __init__(self, model, plan="auto", lossy=False, bucket_cap_mb=25, first_bucket_mb=1):
        super().__init__()
        assert plan == "auto", plan
        self.ddp, self.lossy, self.steps, self.closed = DDP(model), lossy, 0, False
    def forward(self, *args, **kwargs):
        self.steps += 1
        return self.ddp(*args, **kwargs)
    def no_sync(self):
        return self.ddp.no_sync()
    def stats(self):
        learning = self.steps < 10
        sizes, codecs = [1 << 20, 25 << 20, 24 << 20], ["none", "none", "bf16" if self.lossy else "none"]
        return {"buckets": 3, "bucket_bytes": sizes, "codecs": codecs, "steps": self.steps,
                "learning": learning, "decided": None if learning else {"by": "stand-in"},
                "plan": {"buckets": 3, "bucket_bytes": sizes, "lossy_buckets": sum(c != "none" for c in codecs)}}
    def close(self):
        assert not self.closed, "closed twice"
        self.closed = True

ferry.torch.DataParallel = DataParallel
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, nproc=2, stand_in=False, timeout=90):
    """Runs the example in nproc processes as torchrun would; returns (exit codes, rank 0's stdout)."""
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH")) if p))
    head = [sys.executable, "-c", STAND_IN] if stand_in else [sys.executable]
    procs = [subprocess.Popen([*head, str(SCRIPT), *args], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(nproc)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (out, err) in enumerate(outs):
        if procs[r].returncode:
            print(f"--- rank {r} exit {procs[r].returncode}\n{out}\n{err}", file=sys.stderr)
    return [p.returncode for p in procs], outs[0][0]


def results(out_dir):
    doc = json.loads((out_dir / "results.json").read_text())
    assert not (out_dir / "results.json.partial").exists()
    return doc, {row["level"]: row for row in doc["levels"]}


def assert_number_or_skip(row):
    if row["status"] == "skipped":
        assert row["skipped"], row
        assert "steps_per_s" not in row, row  # a skip is never a number
    else:
        assert row["status"] == "ok", f"{row['level']}: {row['error']}"
        assert row["steps_per_s"] > 0 and row["ms_per_step"] > 0, row
        assert len(row["seconds_per_rank"]) == 2


def test_every_level_ends_as_a_number_or_a_stated_skip(tmp_path):
    vit = importlib.import_module("vit_ddp")
    codes, stdout = launch([*SMOKE, "--levels", "all", "--out", str(tmp_path), "--profile", "ddp100"])
    assert codes == [0, 0]
    doc, rows = results(tmp_path)
    assert list(rows) == list(vit.LEVELS)
    for row in rows.values():
        assert_number_or_skip(row)
        line = next(line for line in stdout.splitlines() if line.startswith(row["level"] + " "))
        assert ("skipped: " in line) == (row["status"] == "skipped"), line
    # single: rank 0 alone; the DDP levels that need nothing more than gloo always run (PowerSGD's hook on
    # CPU tensors only before torch 2, whose hook synchronizes a CUDA device: the example says so).
    assert rows["single"]["ranks_timed"] == 1 and rows["single"]["x_single"] == 1.0
    torch2 = int(torch.__version__.split(".")[0]) >= 2
    for level in ("ddp25", "ddp100", "ddp25_view", "ddp100_view", "ddp_powersgd"):
        if level == "ddp_powersgd" and torch2:
            assert rows[level]["status"] == "skipped" and "needs a GPU" in rows[level]["skipped"], rows[level]
            continue
        assert rows[level]["status"] == "ok", rows[level]
        assert rows[level]["ranks_timed"] == 2
    assert max(rows[level]["x_best_ddp"] for level in vit.DDP_LEVELS if level in rows
               and rows[level]["status"] == "ok") == 1.0
    assert doc["world_size"] == 2 and doc["backend"] == "gloo" and doc["mode"] == "timing"
    for key in ("torch", "nccl", "gpu", "torchvision", "model_impl", "config", "best_ddp"):
        assert key in doc, key
    assert "NCCL_P2P_DISABLE" in doc["env"]
    for rank in (0, 1):
        trace = json.loads((tmp_path / f"trace_ddp100_rank{rank}.json").read_text())
        # Kineto writes {"traceEvents": [...]}; a torch built without it (Debian's 1.13) the bare list.
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        assert any(e.get("name", "").startswith("step ") for e in events), rank


def test_ferry_rows_carry_their_plan_and_say_when_the_warm_up_is_short(tmp_path):
    pytest.importorskip("ferry.torch")  # the stand-in is set into the package
    codes, stdout = launch([*SMOKE, "--levels", "single,ddp100,ferry,ferry_lossy", "--out", str(tmp_path)],
                           stand_in=True)
    assert codes == [0, 0]
    _, rows = results(tmp_path)
    for level in ("ferry", "ferry_lossy"):
        row = rows[level]
        assert row["status"] == "ok", row
        assert row["x_best_ddp"] > 0 and row["x_single"] > 0
        assert row["ferry_stats"]["plan"]["buckets"] == 3
        assert row["ferry_stats_before_timing"]["learning"] is True
        assert "warm-up 1 < 15" in row["note"]
    assert rows["ferry_lossy"]["ferry_stats"]["plan"]["lossy_buckets"] == 1
    assert "plan: 3 buckets of 1.0-25.0 MiB, 1 lossy, learning" in stdout


def test_convergence_records_each_curve_against_ddp(tmp_path):
    pytest.importorskip("ferry.torch")
    codes, stdout = launch(["--device", "cpu", "--model", "tiny", "--batch", "4", "--convergence", "4",
                            "--data-batches", "2", "--out", str(tmp_path), "--tolerance", "1e-6"], stand_in=True)
    assert codes == [0, 0]
    doc, rows = results(tmp_path)
    assert doc["mode"] == "convergence" and doc["reference"] == "ddp"
    assert list(rows) == ["ddp", "ferry", "ferry_lossy"]
    for row in rows.values():
        assert row["status"] == "ok", row
        assert len(row["losses"]) == 4 and all(loss > 0 for loss in row["losses"])
        # The stand-in is DDP underneath: the same weights, data and sums give the same curve.
        assert row["max_rel_diff"] == 0.0, row
    assert doc["over_tolerance"] == []
    assert "max rel diff" in stdout


def test_bad_options_are_refused_naming_the_value(capsys):
    vit = importlib.import_module("vit_ddp")
    for argv, text in ((["--levels", "single,ddp9"], "'ddp9'"),
                       (["--levels", "ddp"], "'ddp'"),  # the convergence reference, not a timed level
                       (["--profile", "ferry", "--levels", "single", "--out", "x"], "--profile 'ferry'"),
                       (["--profile", "single"], "--profile needs --out"),
                       (["--model", "tiny", "--image-size", "36"], "--image-size 36"),
                       (["--steps", "0"], "--steps 0")):
        with pytest.raises(SystemExit):
            vit.parse_args(argv)
        assert text in capsys.readouterr().err, argv
    args = vit.parse_args(["--convergence", "5"])
    assert args.level_list == ["ddp", "ferry", "ferry_lossy"] and args.data_batches == 8


def test_the_pure_torch_vit_trains_without_torchvision():
    vit = importlib.import_module("vit_ddp")
    args = vit.parse_args(["--model", "tiny_pure", "--device", "cpu"])
    model = vit.build_model(args, torch.device("cpu"))
    assert isinstance(model, vit.PureViT)
    out = model(torch.randn(3, 3, 32, 32))
    assert out.shape == (3, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_pure_bf16_training_runs_ferry_in_bf16_and_in_f32_and_skips_the_float32_codecs(tmp_path):
    levels = "single,ddp100,ddp_bf16,ferry,ferry_f32,ferry_lossy"
    codes, _ = launch([*SMOKE, "--param-dtype", "bfloat16", "--levels", levels, "--out", str(tmp_path)])
    assert codes == [0, 0]
    doc, rows = results(tmp_path)
    assert doc["config"]["param_dtype"] == "bfloat16"
    for level in ("single", "ferry", "ferry_f32"):
        assert rows[level]["status"] == "ok", rows[level]
    # gloo all-reduces bf16 only in newer torch than Debian's 1.13: DDP runs or says why not.
    assert_number_or_skip(rows["ddp100"])
    for level in ("ddp_bf16", "ferry_lossy"):
        assert rows[level]["status"] == "skipped" and "compresses float32 gradients" in rows[level]["skipped"]
    assert rows["ferry"]["ferry_stats"]["grad_dtype"] == "bf16"
