#!/usr/bin/env bash
# Issue 39's GPU JPEG decode on one GPU: where nvJPEG is on this machine, then scripts/gpu_image.py (ferry's
# nvJPEG decoder checked pixel by pixel against PIL, and timed beside torchvision's decode_jpeg). Run from the
# repository root on the GPU machine with .carry/libferry_c.so (a build of this tree's ferry_c target);
# outputs under $OUT (default /tmp/ferry-out). Extra arguments go to gpu_image.py (--batch, --iters, ...).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
export OUT=$out
echo "== libnvjpeg on this machine (find / -xdev -name 'libnvjpeg*')"
find / -xdev -name 'libnvjpeg*' 2>/dev/null | tee "$out/libnvjpeg.txt"
# The nvidia Python packages' lib folders (nvJPEG among them when nvidia-nvjpeg-cu13 is installed), as the
# lead's other GPU runs set them.
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERRY_LIBRARY=${FERRY_LIBRARY:-$PWD/.carry/libferry_c.so} PYTHONPATH=$PWD/python PYTHONDONTWRITEBYTECODE=1
{ date -u +%FT%TZ; cat .carry/commit 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, torchvision; print(sys.version.split()[0], torch.__version__, torchvision.__version__)'
  nproc; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
echo "== scripts/gpu_image.py $*"
timeout "${GPU_IMAGE_LIMIT:-500}" python3 scripts/gpu_image.py --json "$out/gpu_image.json" "$@" 2>&1 | tee "$out/gpu_image.txt"
rc=${PIPESTATUS[0]}
echo "== gpu_image.py: exit $rc"
exit "$rc"
