#!/usr/bin/env bash
# Call 1 on nvidia-h200 (issue 39): the GPU decoder's checks and bench (scripts/gpu_image.sh), the Loader's
# device decode end to end on a small set, the CPU decode against PIL on this machine's CPU, and the cheap
# samples bench with the GPU. Outputs under $OUT.
set -u
cd "$(dirname "$0")/../../../.."
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))')
export LD_LIBRARY_PATH="$dirs" NCCL_NVLS_ENABLE=0 FERRY_LIBRARY=$PWD/.carry/libferry_c.so PYTHONPATH=$PWD/python \
  FERRY_JPEG_LIBRARY=$PWD/.carry/libjpeg.so.62 PYTHONDONTWRITEBYTECODE=1
GPU_IMAGE_LIMIT=220 bash scripts/gpu_image.sh > "$OUT/gpu_image.log" 2>&1; echo "gpu_image.sh: exit $?"
tail -40 "$OUT/gpu_image.log"
echo "== Loader(decode=ImageDecode(where='device')) end to end"
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/loader_device.txt"
import io, time, numpy as np, torch, ferry.torch as ft
from PIL import Image
rng = np.random.default_rng(0)
imgs = []
for i in range(200):
    h, w = int(rng.integers(300, 500)), int(rng.integers(300, 640))
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], -1) + rng.integers(0, 40, (h, w, 3))
    b = io.BytesIO(); Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(b, "JPEG", quality=90,
                                                                               progressive=(i % 10 == 3)); imgs.append(b.getvalue())
class DS(torch.utils.data.Dataset):
    def __len__(self): return len(imgs)
    def __getitem__(self, i): return imgs[i], i
for where in ("device", "cpu"):
    for cl, dt in ((False, torch.float32), (True, torch.bfloat16)):
        dec = ft.ImageDecode(224, where=where, channels_last=cl, dtype=dt)
        worst = [0.0, 0.0]; bad = 0; n = 0
        with ft.Loader(DS(), batch_size=32, workers=4, shuffle=True, seed=5, decode=dec, drop_last=True) as L:
            for epoch in range(2):
                L.set_epoch(epoch)
                for x, y in L:
                    assert x.is_cuda and x.shape == (32, 3, 224, 224) and x.dtype == dt
                    assert x.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
                    for j in range(0, 32, 7):
                        i = int(y[j]); ref = dec.reference(imgs[i], ft.sample_seed(5, epoch, i)).float()
                        m = torch.tensor(dec.mean).view(3, 1, 1); s = torch.tensor(dec.std).view(3, 1, 1)
                        got = (x[j].float().cpu() * s + m) * 255
                        d = (got - ref).abs(); mean, p99 = float(d.mean()), float(torch.quantile(d.flatten(), 0.99))
                        worst = [max(worst[0], mean), max(worst[1], p99)]
                        limit = (0.01, 0.05) if (where == "cpu" and dt == torch.float32) else (dec.tolerance if where == "device" else (0.6, 2.0))
                        bad += mean > limit[0] or p99 > limit[1]; n += 1
        print(f"where={where} channels_last={cl} {dt}: {n} images checked, {bad} past the tolerance, worst mean {worst[0]:.3f} p99 {worst[1]:.2f}")
PY
echo "== bench_jpeg_cpu.py (this machine's CPU)"
timeout 150 python3 scripts/bench_jpeg_cpu.py --images 48 --large 6 --repeats 5 --json "$OUT/bench_jpeg_cpu.json" 2>&1 | tail -15 | tee "$OUT/bench_jpeg_cpu.txt"
echo "== bench_loader_cheap.py --device cuda"
timeout 150 python3 scripts/bench_loader_cheap.py --device cuda --workers 2 --repeat 3 --json "$OUT/bench_loader_cheap.json" 2>&1 | tail -15 | tee "$OUT/bench_loader_cheap.txt"
