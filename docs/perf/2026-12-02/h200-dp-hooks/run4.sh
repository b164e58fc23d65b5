#!/usr/bin/env bash
# Issue 38, fourth call: plain / DDP / ferry at world size 1 with the levels interleaved in one process
# (scripts/dp_interleaved.py), pure bf16 and fp32 ViT-L/32, both ways of zeroing. Run from the repository
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
i=scripts/dp_interleaved.py
for run in "bf16 --dtype bfloat16" "bf16-inplace --dtype bfloat16 --zero-in-place" "fp32 --dtype float32" \
           "fp32-inplace --dtype float32 --zero-in-place"; do
  set -- $run; name=$1; shift
  t=$SECONDS; timeout 140 python3 $i "$@" --out "$out/$name.json" > "$out/$name.txt" 2>&1
  echo "== $name: exit $?, $((SECONDS - t)) s"; tail -4 "$out/$name.txt"
done
cat "$out/machine.txt"
