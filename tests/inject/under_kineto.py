"""Runs a Python script (its path and arguments follow) inside torch.profiler.profile with CUDA activities,
from its first line to its last: the `kineto` variant of `scripts/gpu.sh trace-inject cost` for a script
that has no profiler option of its own, so PyTorch's own recorder and `ferry trace` can be compared on the
same program. The script's own timing (its steps/s) then includes what the profiler costs; the profiler's
CUDA event count is printed at the end, and none fails the run."""
import os
import runpy
import sys

import torch

if len(sys.argv) < 2:
    sys.exit("usage: under_kineto.py SCRIPT [ARGS...]")
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python3 SCRIPT` would: its folder, not this one's
status = 0
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # the script's own exit status, kept
        status = e.code
# Proof that the profiler recorded the run (a variant that recorded nothing would cost nothing): its GPU
# events, counted after the script's own timing; none is a failure.
gpu_events = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
print(f"torch.profiler CUDA events: {gpu_events}")
sys.exit(status if status else 0 if gpu_events > 0 else 1)
