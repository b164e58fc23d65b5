#!/usr/bin/env bash
# Issue 38, second call: fp32 world-size-1 cost with both ways of zeroing (dp_local_cost.py), pure bf16 with
# every level twice in one process (the order effect), a whole step in a CUDA graph after the
# capture-safety change, and torch.compile for ferry and DDP (dp_compile.py). Run from the repository root
# with .carry/libferry_c.so; outputs under $OUT.
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
  echo "== $name: exit $rc, $((SECONDS - t)) s"; tail -"${TAILN:-9}" "$out/$name.txt"; }
step graph-bf16 120 python3 scripts/dp_graph.py --dtype bfloat16 --out "$out/graph-bf16.json"
step local-fp32 150 python3 scripts/dp_local_cost.py --steps 20 --warmup 12 --out "$out/local-fp32.json"
TAILN=7 step bf16-twice 120 python3 scripts/dp_host_breakdown.py run --dtype bfloat16 --steps 30 \
  --levels plain,ddp,ferry,plain,ddp,ferry --time-hooks --out "$out/bf16-twice"
TAILN=7 step compile 280 python3 scripts/dp_compile.py --model vit_b_32 --steps 60 --out "$out/compile.json"
cat "$out/machine.txt"
