#!/usr/bin/env bash
# Call 2 on nvidia-h200 (issue 39): examples/pytorch/loader_jpeg.py (ResNet-50 bf16 channels_last, batch 256)
# with the two decode levels beside the DataLoader and today's Loader, on 16 cores and on 8 (--cpus 8).
set -u
cd "$(dirname "$0")/../../../.."
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))')
export LD_LIBRARY_PATH="$dirs" FERRY_LIBRARY=$PWD/.carry/libferry_c.so PYTHONPATH=$PWD/python \
  FERRY_JPEG_LIBRARY=$PWD/.carry/libjpeg.so.62 PYTHONDONTWRITEBYTECODE=1
data=/tmp/ferry-jpegs
levels=ideal,dataloader,ferry_loader,ferry_cpu_decode,ferry_gpu_decode
cd examples/pytorch
timeout 330 python3 loader_jpeg.py --data $data --workers 4,14 --levels $levels --steps 40 \
  --json "$OUT/jpeg16.json" > "$OUT/jpeg16.txt" 2>&1; echo "16 cores: exit $?"
tail -12 "$OUT/jpeg16.txt"
timeout 230 python3 loader_jpeg.py --data $data --cpus 8 --workers 4,7 --levels $levels --steps 40 \
  --json "$OUT/jpeg8.json" > "$OUT/jpeg8.txt" 2>&1; echo "8 cores: exit $?"
tail -12 "$OUT/jpeg8.txt"
