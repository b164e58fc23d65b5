#!/usr/bin/env bash
# Call 2: ferry's gradient hooks timed (--time-hooks) in pure bf16 and fp32, the unrecorded levels again
# (plain, DDP, ferry; then ferry first, to see the order's effect), and the GPU suites of the DataParallel
# and Loader tests after this session's last changes to them.
set -u
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export FERRY_LIBRARY=$PWD/.carry/libferry_c.so PYTHONPATH=$PWD/python PYTHONDONTWRITEBYTECODE=1
b=scripts/dp_host_breakdown.py
for v in "bf16 bfloat16 plain,ddp,ferry" "bf16-reversed bfloat16 ferry,ddp,plain" "fp32 float32 plain,ddp,ferry"; do
  set -- $v
  timeout 120 python3 $b run --dtype "$2" --levels "$3" --steps 30 --time-hooks --out "$out/$1" > "$out/$1.txt" 2>&1
  echo "$1: exit $?"; cat "$out/$1.txt"
done
FERRY_TEST_BACKENDS=cuda OMP_NUM_THREADS=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/python/test_data_parallel.py tests/python/test_loader.py tests/python/test_dataloader_peer.py > "$out/cuda-tests.txt" 2>&1
echo "cuda tests: exit $? | $(grep -E '(passed|failed)' "$out/cuda-tests.txt" | tail -1)"
