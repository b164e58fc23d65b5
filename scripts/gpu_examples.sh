#!/usr/bin/env bash
# Runs the two PyTorch side-by-side examples on a GPU machine and leaves their --json and logs in $OUT
# (default ./gpu-examples-out): examples/pytorch/segmentation_egress.py (device-to-host ladder beside
# ferry.torch.Egress) and examples/pytorch/train_prefetch.py (training input with all cores and with 4).
#
#   scripts/gpu_examples.sh                          # every level of both
#   SEG_LEVELS=ideal,ferry TRAIN_LEVELS=ideal,ferry scripts/gpu_examples.sh
#
# ferry's levels need its Python package: python/ on PYTHONPATH and libferry_c.so where the package
# looks for it (FERRY_LIBRARY, or .carry/libferry_c.so when present).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-examples-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
[ -z "${FERRY_LIBRARY:-}" ] && [ -f .carry/libferry_c.so ] && export FERRY_LIBRARY="$PWD/.carry/libferry_c.so"
seg_levels=${SEG_LEVELS:-ideal,L0,L1,L2,L3,L4,L4-pinned,L4-pinned-nocopy,ferry}
train_levels=${TRAIN_LEVELS:-ideal,loader,pinned,reference,ferry}
seg_args=${SEG_ARGS:-}
train_args=${TRAIN_ARGS:-}
tag=${TAG:-}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
  nproc
  df -h /dev/shm | tail -1
  python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
} 2>&1 | tee "$out/machine${tag}.txt"

rc=0
if [ "$seg_levels" != none ]; then
  # shellcheck disable=SC2086
  python3 examples/pytorch/segmentation_egress.py --levels "$seg_levels" $seg_args \
    --json "$out/segmentation${tag}.json" 2>&1 | tee "$out/segmentation${tag}.log" || rc=1
fi
if [ "$train_levels" != none ]; then
  # shellcheck disable=SC2086
  python3 examples/pytorch/train_prefetch.py --levels "$train_levels" $train_args \
    --json "$out/train-allcpu${tag}.json" 2>&1 | tee "$out/train-allcpu${tag}.log" || rc=1
  # shellcheck disable=SC2086
  python3 examples/pytorch/train_prefetch.py --levels "$train_levels" --cpus 4 $train_args \
    --json "$out/train-4cpu${tag}.json" 2>&1 | tee "$out/train-4cpu${tag}.log" || rc=1
fi
exit $rc
