#!/usr/bin/env bash
# Call 3 on nvidia-h200 (issue 39): the GPU decoder with its host work on several threads against one
# (scripts/gpu_image.sh, every check), then loader_jpeg.py (ResNet-50 bf16 channels_last, batch 256) with
# the decode levels, the DataLoader and today's Loader, and Loader(workers="auto"), on 16 and on 8 cores.
set -u
cd "$(dirname "$0")/../../../.."
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))')
export LD_LIBRARY_PATH="$dirs" FERRY_LIBRARY=$PWD/.carry/libferry_c.so PYTHONPATH=$PWD/python \
  FERRY_JPEG_LIBRARY=$PWD/.carry/libjpeg.so.62 PYTHONDONTWRITEBYTECODE=1
GPU_IMAGE_LIMIT=200 bash scripts/gpu_image.sh > "$OUT/gpu_image.log" 2>&1; echo "gpu_image.sh: exit $?"
grep -E "^\s+\[(FAIL|fail)|^checks|images/s|^ferry|^torchvision|threads" "$OUT/gpu_image.log" | head -30
data=/tmp/ferry-jpegs
levels=ideal,dataloader,ferry_loader,ferry_cpu_decode,ferry_gpu_decode
cd examples/pytorch
timeout 280 python3 loader_jpeg.py --data $data --workers 4,14,auto --levels $levels --steps 40 \
  --json "$OUT/jpeg16.json" > "$OUT/jpeg16.txt" 2>&1; echo "16 cores: exit $?"
grep -A14 "^JPEG training input" "$OUT/jpeg16.txt" | cut -c1-240
timeout 250 python3 loader_jpeg.py --data $data --cpus 8 --workers 4,7,auto --levels $levels --steps 40 \
  --json "$OUT/jpeg8.json" > "$OUT/jpeg8.txt" 2>&1; echo "8 cores: exit $?"
grep -A14 "^JPEG training input" "$OUT/jpeg8.txt" | cut -c1-240
