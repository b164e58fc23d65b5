#!/usr/bin/env bash
# Call 4 on nvidia-h200 (issue 39): the threaded GPU decoder with one nvJPEG handle per thread (call 3's
# shared handle failed), its checks and bench, then loader_jpeg.py's device decode level on 16 and 8 cores.
set -u
cd "$(dirname "$0")/../../../.."
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))')
export LD_LIBRARY_PATH="$dirs" FERRY_LIBRARY=$PWD/.carry/libferry_c.so PYTHONPATH=$PWD/python \
  FERRY_JPEG_LIBRARY=$PWD/.carry/libjpeg.so.62 PYTHONDONTWRITEBYTECODE=1
GPU_IMAGE_LIMIT=130 bash scripts/gpu_image.sh > "$OUT/gpu_image.log" 2>&1; echo "gpu_image.sh: exit $?"
grep -E "\[FAIL\]|^checks|^level|^ferry|^torchvision" "$OUT/gpu_image.log" | cut -c1-200 | head -30
cd examples/pytorch
timeout 170 python3 loader_jpeg.py --data /tmp/ferry-jpegs --workers 4 --levels ideal,ferry_gpu_decode --steps 40 \
  --json "$OUT/jpeg16.json" > "$OUT/jpeg16.txt" 2>&1; echo "16 cores: exit $?"
grep -A5 "^JPEG training input" "$OUT/jpeg16.txt" | cut -c1-240
# (the 8-core run was cut: the session's device time)
