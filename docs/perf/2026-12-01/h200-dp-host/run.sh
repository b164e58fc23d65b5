#!/usr/bin/env bash
# Issue 38's first measurement on one GPU: where the host time of a world-size-1 data-parallel step goes,
# plain / DDP (100 MB, views, static graph) / ferry.torch.DataParallel, pure bf16 ViT-L/32 (batch 32) and
# fp32, unrecorded and then under `ferry trace` (scripts/dp_host_breakdown.py). Run from the repository
# root with .carry/ (scripts/gpu.sh carry); outputs under $OUT.
set -u
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export FERRY_LIBRARY=$PWD/.carry/libferry_c.so FERRY_INJECT_LIBRARY=$PWD/.carry/libferry_inject.so \
  FERRY_TRACE_SITE=$PWD/python/ferry/_trace_site PYTHONPATH=$PWD/python PYTHONDONTWRITEBYTECODE=1
{ date -u +%FT%TZ; cat .carry/commit; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'; nproc; } > "$out/machine.txt" 2>&1
b=scripts/dp_host_breakdown.py
timeout 150 python3 $b run --dtype bfloat16 --steps 30 --out "$out/bf16-plain" > "$out/bf16-plain.txt" 2>&1
echo "bf16 unrecorded: exit $?"; cat "$out/bf16-plain.txt"
timeout 150 python3 $b run --dtype float32 --steps 20 --out "$out/fp32-plain" > "$out/fp32-plain.txt" 2>&1
echo "fp32 unrecorded: exit $?"; cat "$out/fp32-plain.txt"
timeout 200 .carry/ferry trace -o "$out/rec" -- python3 $b run --dtype bfloat16 --steps 30 --port 29542 \
  --out "$out/bf16-traced" > "$out/bf16-traced.txt" 2>&1
echo "bf16 traced: exit $?"; tail -8 "$out/bf16-traced.txt"
timeout 100 python3 $b analyze "$out/rec/trace.json" "$out/bf16-traced/levels.json" > "$out/breakdown.txt" 2>&1
echo "analyze: exit $?"
gzip -9 "$out/rec/trace.json" 2>/dev/null
rm -f "$out/rec"/*.ferry-proc  # trace.json.gz holds what they held
du -sh "$out"/* | sort -h | tail -5
cat "$out/machine.txt"
tail -5 "$out/breakdown.txt"
