"""Runs a Python script (its path and arguments follow) inside torch.profiler.profile with CUDA activities,
from its first line to its last: the `kineto` variant of `scripts/gpu.sh trace-cost program` for a script
that has no profiler option of its own, so PyTorch's own recorder and `ferry trace` can be compared on the
same program. The script's own timing (its steps/s) then includes what the profiler costs; the profiler's
CUDA event count is printed at the end, and none fails the run.

FERRY_KINETO_SYNC=1 also records CUDA's synchronizations (PyTorch's `enable_cuda_sync_events`, off by
default, which `ferry trace` records unless --no-syncs): the `kinetosync` variant. Their count is printed
too, from the exported trace, and none fails the run."""
import json
import os
import runpy
import sys
import tempfile

import torch

if len(sys.argv) < 2:
    sys.exit("usage: under_kineto.py SCRIPT [ARGS...]")
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python3 SCRIPT` would: its folder, not this one's
syncs = os.environ.get("FERRY_KINETO_SYNC") == "1"
extra = {}
if syncs:
    try:
        extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except (AttributeError, TypeError) as e:
        sys.exit(f"under_kineto.py: FERRY_KINETO_SYNC=1 needs torch.profiler's enable_cuda_sync_events "
                 f"(torch {torch.__version__} has none: {e})")
status = 0
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], **extra) as prof:
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # the script's own exit status, kept
        status = e.code
# Proof that the profiler recorded the run (a variant that recorded nothing would cost nothing): its GPU
# events, counted after the script's own timing; none is a failure.
gpu_events = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
print(f"torch.profiler CUDA events: {gpu_events}")
sync_events = None
if syncs:  # the synchronizations are in the exported trace only, as category cuda_sync
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            sync_events = sum(1 for e in json.load(f).get("traceEvents", []) if e.get("cat") == "cuda_sync")
    print(f"torch.profiler CUDA synchronization events: {sync_events}")
sys.exit(status if status else 0 if gpu_events > 0 and sync_events != 0 else 1)
