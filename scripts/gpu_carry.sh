#!/usr/bin/env bash
# Packs what a run on the lent GPU machine needs into .carry/ (ignored by git): the stripped ferry CLI,
# the GPU-capable test binaries of the default build (cuda backend, cudart static) and libferry_c.so
# (for the Python package: FERRY_LIBRARY=.carry/libferry_c.so PYTHONPATH=python). The GPU machine has no
# GoogleTest, fmt or CLI11, so the binaries are built here and carried there. With FERRY_BASELINE_DIR set to
# another build's folder, its CLI is carried too as .carry/ferry_baseline (scripts/gpu_verify.sh compares).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FERRY_BUILD_DIR:-build/default}
[ "$build" != build/default ] || scripts/build.sh default >/dev/null
rm -rf .carry && mkdir -p .carry
for b in tools/ferry/ferry tests/ferry_bench_tests tests/ferry_device_tests tests/ferry_probe_tests \
         tests/ferry_trace_tests tests/ferry_core_tests tests/ferry_egress_tests tests/ferry_ingest_tests tests/ferry_shim_tests \
         tests/ferry_comm_tests; do
  strip -o ".carry/$(basename "$b")" "$build/$b"
done
# The C ABI for the Python package (python/ travels with the tree): FERRY_LIBRARY=.carry/libferry_c.so.
strip -o .carry/libferry_c.so "$build/src/c/libferry_c.so"
if [ -n "${FERRY_BASELINE_DIR:-}" ]; then
  strip -o .carry/ferry_baseline "$FERRY_BASELINE_DIR/tools/ferry/ferry"
fi
git describe --always --dirty > .carry/commit
du -sh .carry
