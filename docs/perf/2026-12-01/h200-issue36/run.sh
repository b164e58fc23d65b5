#!/usr/bin/env bash
# Issue 36 on one H200 (torch 2.11, Python 3.12): the ported DDP and DataLoader peer tests and the
# DataParallel/Loader/launch suites on the host backend under torch 2.11's own DDP and DataLoader, then the
# DataParallel, Loader, Prefetcher, DataLoader-peer and cuda suites on the GPU. Run from the repository root
# with .carry/ (scripts/gpu.sh carry); outputs under $OUT.
set -u
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export FERRY_LIBRARY=$PWD/.carry/libferry_c.so FERRY_CLI=$PWD/.carry/ferry PYTHONPATH=$PWD/python PYTHONDONTWRITEBYTECODE=1
{ date -u +%FT%TZ; cat .carry/commit; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())'
  nproc; } > "$out/machine.txt" 2>&1
run() {  # NAME BACKENDS LIMIT FILES...
  local name=$1 backends=$2 limit=$3
  shift 3
  FERRY_TEST_BACKENDS=$backends OMP_NUM_THREADS=1 timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rs "$@" \
    > "$out/$name.txt" 2>&1
  echo "$name: exit $? | $(grep -E '(passed|failed|error)' "$out/$name.txt" | tail -1)" | tee -a "$out/summary.txt"
}
run host-torch211 host 200 tests/python/test_ddp_peer.py tests/python/test_dataloader_peer.py \
  tests/python/test_data_parallel.py tests/python/test_launch.py
run cuda cuda 330 tests/python/test_data_parallel.py tests/python/test_loader.py tests/python/test_prefetch.py \
  tests/python/test_dataloader_peer.py tests/python/test_cuda.py
cat "$out/machine.txt"
