"""Where a ferry.torch.Loader's first batch goes, on a GPU machine: the threads that imports start (numpy's
OpenBLAS pool, CUDA's), and the time to the first batch and per batch by start method (fork, forkserver,
forkserver with torch preloaded, spawn, the default) at 1 and 8 workers, each in a fresh process, twice
(the second Loader finds a forkserver running). Needs FERRY_LIBRARY; run from the repository root:

    FERRY_LIBRARY=$PWD/.carry/libferry_c.so python3 scripts/loader_start.py

docs/perf/2026-11-27/h200-loader/README.md has its output on an H200."""
import os
import subprocess
import sys
import tempfile
import time


def census(code):
    r = subprocess.run([sys.executable, "-c", code + "\nimport os\nt=os.listdir('/proc/self/task')\n"
                        "print(len(t), sorted(open(f'/proc/self/task/{x}/comm').read().strip() for x in t))"],
                       capture_output=True, text=True)
    return r.stdout.strip() or r.stderr.strip()[-300:]


BODY = r'''
import sys, time, os
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "python"))
import ferry.torch as ft
class DS:
    def __len__(self): return 4096
    def __getitem__(self, i): return torch.full((3, 64, 64), i % 251, dtype=torch.uint8), i
if __name__ == "__main__":
    method, n = sys.argv[1], int(sys.argv[2])
    if method == "preload":
        import multiprocessing
        multiprocessing.set_forkserver_preload(["torch", "ferry.torch"])
        method = "forkserver"
    if sys.argv[3] == "cuda":
        torch.zeros(1, device="cuda")
    out = []
    for rep in range(2):
        t0 = time.perf_counter()
        with ft.Loader(DS(), batch_size=256, workers=n, start_method=None if method == "default" else method,
                       device=sys.argv[3]) as L:
            it = iter(L)
            next(it)
            t1 = time.perf_counter()
            for _ in range(8): next(it)
            t2 = time.perf_counter()
            out.append((L.start_method, round(t1 - t0, 2), round((t2 - t1) / 8 * 1000, 1)))
    print(out)
'''


def main():
    print("census import numpy:", census("import numpy"))
    print("census import torch:", census("import torch"))
    print("census import torch,torchvision:", census("import torch, torchvision"))
    print("census torch cuda init:", census("import torch; torch.zeros(1, device='cuda')"))
    body = os.path.join(tempfile.mkdtemp(prefix="ferry-loader-start-"), "body.py")
    with open(body, "w") as f:
        f.write(BODY)
    for method in ("fork", "forkserver", "preload", "spawn", "default"):
        for n in (1, 8):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, body, method, str(n), "cuda"], capture_output=True, text=True,
                               timeout=100)
            print(f"cuda {method:10s} N={n:2d} total {time.perf_counter() - t0:6.1f}s  "
                  "[(method, 1st batch s, ms/batch) x2]:", r.stdout.strip() or r.stderr.strip()[-400:], flush=True)


if __name__ == "__main__":
    main()
