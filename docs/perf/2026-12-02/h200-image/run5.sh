#!/usr/bin/env bash
# Call 5 on nvidia-h200 (issue 39): loader_jpeg.py's device decode level with the decoder's one host thread
# (call 4 ran the Loader with a carried library whose default was still four), 16 cores, 4 workers.
set -u
cd "$(dirname "$0")/../../../.."
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))')
export LD_LIBRARY_PATH="$dirs" FERRY_LIBRARY=$PWD/.carry/libferry_c.so PYTHONPATH=$PWD/python \
  FERRY_JPEG_LIBRARY=$PWD/.carry/libjpeg.so.62 PYTHONDONTWRITEBYTECODE=1
cd examples/pytorch
timeout 140 python3 loader_jpeg.py --data /tmp/ferry-jpegs --workers 4 --levels ideal,ferry_gpu_decode --steps 40 \
  --json "$OUT/jpeg16.json" > "$OUT/jpeg16.txt" 2>&1; echo "16 cores: exit $?"
grep -A4 "^JPEG training input" "$OUT/jpeg16.txt" | cut -c1-260
