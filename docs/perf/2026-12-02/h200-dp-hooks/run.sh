#!/usr/bin/env bash
# Issue 38 after the hooks moved into C (one H200, world size 1): the DataParallel tests under torch 2.x
# (post-accumulate-grad hooks), plain / DDP / ferry steps/s in pure bf16 and fp32 ViT-L/32 with ferry's
# backward Python timed, the CPU bench, and a whole step captured in a CUDA graph. Run from the repository
# root with .carry/libferry_c.so; outputs under $OUT.
set -u
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export FERRY_LIBRARY=$PWD/.carry/libferry_c.so PYTHONPATH=$PWD/python PYTHONDONTWRITEBYTECODE=1
{ date -u +%FT%TZ; cat .carry/commit; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'; nproc; } > "$out/machine.txt" 2>&1
step() { local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1; local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s"; tail -"${TAILN:-8}" "$out/$name.txt"; }
FERRY_TEST_BACKENDS=host,cuda TAILN=4 step tests 200 python3 -m pytest -q -p no:cacheprovider -x \
  tests/python/test_data_parallel.py -k "fixed_number or dropped or misuses or one_gpu or static_graph or ddps_constructor or zero_after or no_sync"
b=scripts/dp_host_breakdown.py
step bf16 120 python3 $b run --dtype bfloat16 --steps 30 --time-hooks --out "$out/bf16"
step fp32 120 python3 $b run --dtype float32 --steps 20 --time-hooks --port 29543 --out "$out/fp32"
step graph-bf16 150 python3 scripts/dp_graph.py --dtype bfloat16 --out "$out/graph-bf16.json"
step cpu-bench 60 python3 scripts/dp_cpu_cost.py --rounds 5 --steps 30 --out "$out/cpu-bench.json"
cat "$out/machine.txt"
