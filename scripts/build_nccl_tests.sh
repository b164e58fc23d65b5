#!/usr/bin/env bash
# Builds NVIDIA nccl-tests' all_reduce_perf for the GPU machines (sm_90, CUDA runtime linked statically,
# NCCL from the CUDA toolkit's nccl.h, found at run time through LD_LIBRARY_PATH) OUTSIDE this repository:
# no third-party source enters it. Usage: scripts/build_nccl_tests.sh NCCL_TESTS_CHECKOUT [BUILD_DIR]
# (default /tmp/nccl-tests-build); prints the binary's path, for FERRY_NCCL_TESTS=... scripts/gpu.sh carry.
set -euo pipefail
src=${1:?usage: build_nccl_tests.sh NCCL_TESTS_CHECKOUT [BUILD_DIR]}
build=${2:-/tmp/nccl-tests-build}
cuda=${CUDA_HOME:-/usr/local/cuda}
case "$(realpath "$build")/" in "$(realpath "$(dirname "$0")/..")"/*) echo "build outside the repository" >&2; exit 2;; esac
mkdir -p "$build"
# With Open MPI (FERRY_NCCL_TESTS_MPI=1, Debian's libopenmpi-dev): one process per GPU under mpirun, as
# `ferry bench allreduce --bootstrap mpi`; libmpi.so.40 is found at run time on the GPU machine.
mpi=()
if [ "${FERRY_NCCL_TESTS_MPI:-0}" = 1 ]; then
  mpi=(MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi)
fi
make -C "$src/src" -j2 "$(realpath "$build")/all_reduce_perf" BUILDDIR="$(realpath "$build")" NCCL_HOME="$cuda" \
  CUDA_HOME="$cuda" CUDARTLIB=cudart_static NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" "${mpi[@]}" >&2
strip "$build/all_reduce_perf"
echo "$(realpath "$build")/all_reduce_perf"
