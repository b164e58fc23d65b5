#!/usr/bin/env bash
# Runs on the lent 2-GPU machine (nvidia-h200-x2) from the repository root, with .carry/ made by
# scripts/gpu_carry.sh: the cuda and multigpu suites of the device-to-device path (peer copies, the codecs'
# kernels against the host code, the NCCL communicator with its fault tests, the reducer over NCCL with
# NVLink and with NCCL_P2P_DISABLE=1, PowerSGD on cuda against the host implementation), then the local
# cost of the reducer and its codecs at world size 1 (`ferry bench ddp --gpus 1`: every level against the
# same steps with no reducer), and NCCL over two processes of an mpirun job (the MPI bootstrap: collectives
# and the reducer, one GPU per process). Raw outputs go to $OUT; a short table is printed last.
set -uo pipefail
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
c=.carry
sp=$(python3 -c 'import site; print(site.getsitepackages()[0])')
for d in "$sp"/nvidia/*/lib; do LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
echo "date: $(date -u +%FT%TZ)  commit: $(cat $c/commit 2>/dev/null)  NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset}"
declare -A rc
run() {  # name, command...
  local name=$1; shift
  "$@" > "$out/$name.log" 2>&1; rc[$name]=$?
  echo "$name: rc ${rc[$name]}: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
}
run device_peer env FERRY_TEST_BACKENDS=cuda "$c/ferry_device_tests" --gtest_filter='*peer*:*another_device*'
run comm_cuda env FERRY_TEST_BACKENDS=cuda "$c/ferry_comm_tests" --gtest_filter='backends/*'
run comm_nccl "$c/ferry_comm_tests" --gtest_filter='nccl*:reducer_nccl.*'
run reducer_nccl_p2p_off env NCCL_P2P_DISABLE=1 "$c/ferry_comm_tests" --gtest_filter='reducer_nccl.*'
run powersgd_gpu env FERRY_TEST_GPUS=2 "$c/ferry_comm_tests" --gtest_filter='powersgd_gpu.*'
run shim "$c/ferry_shim_tests" --gtest_filter='nccl*:cublas*:mpi*'
# mpirun as root (the lent machine's user), the library path passed on to both processes.
run comm_nccl_mpi env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -n 2 -x LD_LIBRARY_PATH "$c/ferry_comm_tests" --gtest_filter='nccl_mpi.*:mpi_job.*'
"$c/ferry" bench ddp --backend cuda --gpus 1 --levels single,25MB,100MB,bf16,fp16,powersgd,auto \
  --json > "$out/ddp_world1.json" 2> "$out/ddp_world1.err"; rc[ddp_world1]=$?
echo "=== summary"
for k in "${!rc[@]}"; do echo "rc $k=${rc[$k]}"; done | sort
python3 - "$out/ddp_world1.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:  # noqa: BLE001 - say what is missing
    sys.exit(f"ddp_world1.json unreadable: {e}")
print("world size 1 (local cost): level, steps/s, x single, mismatches")
for r in d["rows"]:
    print(f"  {r['level']:<11} {r.get('steps_per_s', 0):8.3f} {r.get('ratio_to_ideal', 0):6.3f} {r.get('mismatches', '?')}")
PY
