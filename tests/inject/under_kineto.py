"""Runs a Python script (its path and arguments follow) inside torch.profiler.profile with CUDA activities,
from its first line to its last: the `kineto` variant of `scripts/gpu.sh trace-inject cost` for a script
that has no profiler option of its own, so PyTorch's own recorder and `ferry trace` can be compared on the
same program. The script's own timing (its steps/s) then includes what the profiler costs."""
import os
import runpy
import sys

import torch

if len(sys.argv) < 2:
    sys.exit("usage: under_kineto.py SCRIPT [ARGS...]")
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python3 SCRIPT` would: its own folder first
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
    runpy.run_path(script, run_name="__main__")
