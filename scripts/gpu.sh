#!/usr/bin/env bash
# The one entry point for work on the lent GPU machines (scripts/README.md says how a session uses it).
#
#   scripts/gpu.sh carry                           HERE: pack .carry/ (binaries + their CTest file) for the GPU machine
#   scripts/gpu.sh tests [LABEL] [CTEST ARGS...]   THERE: ctest -L ^LABEL$ over the carried tests (default gpu;
#                                                  multigpu on 2 or more GPUs; sanitizer; cpu works anywhere)
#   scripts/gpu.sh WORKLOAD [MODE]                 THERE: one named workload (below; MODE defaults to the first)
#   scripts/gpu.sh -n|--dry-run WORKLOAD [MODE]    prints the commands the workload would run, and runs none
#   scripts/gpu.sh list                            the workloads, their modes and what each runs
#
# A workload runs from the repository root on the GPU machine with .carry/ made by `carry`, in a work
# folder, and leaves two files under $OUT (default /tmp/ferry-out): WORKLOAD-MODE${TAG}.tgz (every raw
# output and log) and WORKLOAD-MODE${TAG}.txt (its summary, also printed last; the exit status of each
# step and the tables of scripts/gpu_summary.py). It exits 1 when any step failed. The test filters live
# in tests/CMakeLists.txt alone: the carried .carry/CTestTestfile.cmake (scripts/carry_ctest.py) holds
# them, so `tests` runs ctest by label and no workload repeats a filter. A run of one session's own
# sequence (stages cut to fit a time limit, a one-off comparison) is written down in that run's notes,
# docs/perf/<date>/<run>/README.md, as the commands it ran.
set -uo pipefail
cd "$(dirname "$0")/.."
here=scripts
c=${FERRY_CARRY:-.carry}
# The carry folder as an absolute path, for programs that run from another folder.
case $c in /*) abs_c=$c ;; *) abs_c=$PWD/$c ;; esac

# name|modes (the first is the default)|what it runs. `list`, --help and the dispatcher read this table.
WORKLOADS=(
  "ladders|all egress ingest|ferry's egress and ingest ladders at the reference shapes (egress also in its pure-copy mode), each beside .carry/ferry_baseline when carried (an A/B on one machine), and probe --topology"
  "examples|all seg train|the PyTorch side-by-side examples: segmentation_egress.py (SEG_LEVELS, SEG_ARGS) and train_prefetch.py with every core and with 4 (TRAIN_LEVELS, TRAIN_ARGS)"
  "vit-ddp|all nvlink p2p_off convergence|2 GPUs (FERRY_GPUS): examples/pytorch/vit_ddp.py, ViT-L/32 under PyTorch's DDP beside ferry.torch.DataParallel, over NVLink (VIT_LEVELS; VIT_PROFILE traced per rank, none for no trace), with NCCL_P2P_DISABLE=1, and the convergence guard (VIT_CONV_STEPS, VIT_CONV_MODEL, VIT_CONV_LEVELS); VIT_ARGS for every run"
  "comm|all allreduce ddp local|2 GPUs (FERRY_GPUS): bench allreduce 1 MiB .. 2 GiB beside nccl-tests (when carried) and PyTorch, and bench ddp, over NVLink and with P2P off, in one process and under mpirun; local, 1 GPU: the per-call cost of allreduce --gpus 1 and ddp --gpus 1 (FERRY_LEVELS), with .carry/ferry_baseline and .carry/ferry_v* too, then ddp traced (FERRY_TRACE_LEVELS)"
  "loader|jpeg train4|ferry.torch.Loader: examples/pytorch/loader_jpeg.py, JPEG ResNet-50 (LOADER_WORKERS, LOADER_CPUS, LOADER_ARGS), and train_prefetch.py --cpus 4 with the Loader beside the DataLoader levels"
  "trace|smoke findings ladders|ferry trace -- CMD on the GPU: smoke (parity with the in-process recorder on both ladders' L1, torch.profiler inside a recorded program, the examples recorded and analyzed; SMOKE_PARTS), findings (each reference level of the examples recorded unmodified, its first finding), ladders (both ladders with --trace, each level's bottleneck against the expected one, and a torch.profiler trace of a naive loop analyzed)"
  "trace-cost|program api bench|what recording costs: program (TRACE_EXAMPLE or TRACE_SCRIPT run plain and under each of TRACE_VARIANTS, interleaved, TRACE_RUNS rounds; TRACE_ARGS, TRACE_RANKS), api (one CUDA call's cost, tests/inject/api_cost.py), bench (the in-process recorder on the egress ladder's ideal and ferry rows, FERRY_COST_ROUNDS rounds)"
)

# Subcommands of earlier versions and the commands that replace them (their runs' notes keep the old names).
REMOVED=(
  "check|tests gpu; tests sanitizer; ladders egress"
  "verify|tests gpu; tests cpu -R '^shim\$' (the shim, with the GPU machine's libraries); ladders (beside .carry/ferry_baseline when carried)"
  "trace-check|GTEST_FILTER='*trace*' tests gpu -R '^device_cuda\$'; trace-cost bench; trace ladders; ladders (probe --topology)"
  "trace-inject|trace smoke; trace findings; trace-cost program (was cost); trace-cost api"
  "comm-tests|tests multigpu; FERRY_TEST_GPUS=2 tests gpu -R '^comm_'; NCCL_P2P_DISABLE=1 tests multigpu -R '^comm_nccl\$'; tests cpu -R '^(comm_mpi|shim)\$'; FERRY_LEVELS=single,25MB,100MB,bf16,fp16,powersgd,auto comm local"
  "one-gpu-comm|comm local"
  "dp|its stages' commands are in their runs' notes: docs/perf/2026-11-26/h200x4-dp/README.md, docs/perf/2026-11-27/h100x2-dp/README.md"
  "loader tests|PYTEST_ADDOPTS='-k test_loader' GTEST_FILTER='*ingest_feed*' tests gpu -R '^(python_cuda|ingest_cuda)\$'"
)

# Dies naming what replaces removed subcommand (or workload mode) $1, when it is one.
removed() {
  local r old new
  for r in "${REMOVED[@]}"; do
    IFS='|' read -r old new <<< "$r"
    [ "$old" = "$1" ] && die "'$1' was removed; instead: $new"
  done
  return 0
}

usage() {
  sed -n '2,/^[^#]/p' "$0" | sed -n 's/^# \{0,1\}//p'
  echo
  echo "Workloads:"
  list_workloads
  echo
  echo "Labels of the carried tests: cpu, gpu, multigpu, sanitizer (compute-sanitizer over the cuda tests)."
}

list_workloads() {
  local w name modes what
  for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r name modes what <<< "$w"
    printf '  %-11s %s\n' "$name" "[${modes// /|}]"
    printf '%s\n' "$what" | fold -s -w 96 | sed 's/ *$//; s/^/      /'
  done
}

die() {
  echo "gpu.sh: $*" >&2
  exit 2
}

# The modes of workload $1, or nothing when it is not one.
modes_of() {
  local w name modes what
  for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r name modes what <<< "$w"
    if [ "$name" = "$1" ]; then echo "$modes"; return 0; fi
  done
  return 1
}

# NCCL, cuBLAS and the other NVIDIA libraries from the GPU machine's nvidia-* Python packages.
# NVLink multicast stays off (a program that uses it can take the shared GPUs out of service).
nvidia_libs() {
  export NCCL_NVLS_ENABLE=0
  [ "$dry" = 1 ] && return 0
  local dirs
  dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
  [ -n "$dirs" ] && export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# ferry's Python package from the tree and the carried libferry_c.so (FERRY_LIBRARY overrides).
python_env() {
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  [ -z "${FERRY_LIBRARY:-}" ] && [ -f "$c/libferry_c.so" ] && export FERRY_LIBRARY="$abs_c/libferry_c.so"
  return 0
}

# ctest: on PATH, or the one of python3's cmake package (the GPU machine's CMake 4); CTEST overrides.
find_ctest() {
  CTEST=${CTEST:-$(command -v ctest || true)}
  if [ -z "$CTEST" ]; then
    local d
    d=$(python3 -c 'import cmake; print(cmake.CMAKE_BIN_DIR)' 2>/dev/null) && CTEST="$d/ctest"
  fi
  if [ -z "$CTEST" ] || [ ! -x "$CTEST" ]; then
    die "no ctest on PATH nor in python3's cmake package (set CTEST)"
  fi
  [ -f "$c/CTestTestfile.cmake" ] || die "$c/CTestTestfile.cmake is missing: run scripts/gpu.sh carry here first"
  FERRY_CARRY_DIR=$(cd "$c" && pwd -P)
  export FERRY_CARRY_DIR
}

# ---------------------------------------------------------------------------------------------- steps
# A workload is a list of steps. step NAME CMD... runs CMD with its stdout and stderr in NAME.log of the
# work folder; json NAME CMD... puts its stdout (a --json result) in NAME.json, its stderr in NAME.log.
# Each step's exit status is rc[NAME]. Under --dry-run both print the command instead ($WORK: the work
# folder) and carried(FILE) is always true, so the listing shows every step a workload can run.
declare -A rc
dry=0
work=/nonexistent-work-folder

# A word the listing shows as it is: no quoting needed to read it (globs and $WORK are shown literally).
plain_word='^[][A-Za-z0-9_./:=,+@%^$*-]+$'
show() {
  local kind=$1 name=$2 line="" word
  shift 2
  for word in "$@"; do
    # shellcheck disable=SC2016  # the listing names the work folder $WORK, literally
    word=${word//"$work"/'$WORK'}
    word=${word//"$PWD/"/}
    if [[ $word =~ $plain_word ]]; then line+=" $word"; else line+=" $(printf '%q' "$word")"; fi
  done
  if [ "$kind" = json ]; then echo "$name:$line > \$WORK/$name.json"; else echo "$name:$line"; fi
}

run_step() {
  local kind=$1 name=$2
  shift 2
  if [ "$dry" = 1 ]; then show "$kind" "$name" "$@"; rc[$name]=0; return 0; fi
  echo "=== $name"
  if [ "$kind" = json ]; then "$@" > "$work/$name.json" 2> "$work/$name.log"; else "$@" > "$work/$name.log" 2>&1; fi
  rc[$name]=$?
  if [ "${rc[$name]}" != 0 ]; then
    echo "$name: exit ${rc[$name]}; the end of $name.log:"
    tail -n 5 "$work/$name.log"
  fi
  return 0
}
step() { run_step log "$@"; }
json() { run_step json "$@"; }

# True when the carry folder holds FILE (always, under --dry-run: it says the step depends on it).
carried() {
  if [ "$dry" = 1 ]; then echo "# when $c/$1 is carried:"; return 0; fi
  [ -e "$c/$1" ]
}

# True when PROGRAM is on PATH (always, under --dry-run, as carried).
on_path() {
  if [ "$dry" = 1 ]; then echo "# when $1 is on PATH:"; return 0; fi
  command -v "$1" >/dev/null
}

mk() { [ "$dry" = 1 ] || mkdir -p "$@"; }
drop() { [ "$dry" = 1 ] || rm -rf "$@"; }

# begin NAME: the work folder of workload NAME (its mode included) and the machine it runs on.
begin() {
  name=$1${TAG:-}
  final=${OUT:-/tmp/ferry-out}
  if [ "$dry" = 1 ]; then
    echo "# $name: the steps, in order (\$WORK is the work folder; $final/$name.tgz and .txt the outputs)"
    return 0
  fi
  mkdir -p "$final"
  work=$(mktemp -d "/tmp/gpu-$name.XXXX")
  {
    echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat "$c/commit" 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
  } > "$work/machine.txt" 2>&1
  cat "$work/machine.txt"
}

# finish SUMMARY-ARGS...: the summary (each step's exit status, then scripts/gpu_summary.py SUMMARY-ARGS
# over the work folder) printed and in $OUT/NAME.txt, the work folder in $OUT/NAME.tgz; 1 when a step failed.
finish() {
  if [ "$dry" = 1 ]; then echo "summary: python3 $here/gpu_summary.py $* \$WORK"; return 0; fi
  local k status=0
  {
    cat "$work/machine.txt"
    for k in $(printf '%s\n' "${!rc[@]}" | sort); do
      echo "rc $k=${rc[$k]}"
      [ "${rc[$k]}" = 0 ] || status=1
    done
    python3 "$here/gpu_summary.py" "$@" "$work"
  } > "$work/summary.txt" 2>&1
  cp "$work/summary.txt" "$final/$name.txt"
  tar -czf "$final/$name.tgz" -C "$work" . && rm -rf "$work"
  echo "=== summary ($final/$name.txt, raw outputs in $final/$name.tgz)"
  cat "$final/$name.txt"
  return $status
}

# An mpirun job as root on the GPU machine, with the NVIDIA libraries and NVLink multicast off.
mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)

# ---------------------------------------------------------------------------------------------- carry
# Packs what a run on the GPU machine needs into .carry/ (ignored by git): the stripped ferry CLI, the
# test binaries of the build (cuda backend, cudart static), libferry_c.so (for the Python package:
# FERRY_LIBRARY=.carry/libferry_c.so PYTHONPATH=python) and .carry/CTestTestfile.cmake, the build's tests
# with their paths made relative (scripts/carry_ctest.py), which also carries any other binary a gpu or
# multigpu test runs. The GPU machine has no GoogleTest, fmt or CLI11, so the binaries are built here.
# FERRY_BUILD_DIR: a build folder taken as built (unset: build/default, built first by scripts/build.sh).
# FERRY_BASELINE_DIR: another build folder, whose CLI is carried as .carry/ferry_baseline (ladders and
# comm local compare) and its injection library as .carry/baseline_inject.so (trace-cost's variant base).
# FERRY_NCCL_TESTS: NVIDIA nccl-tests' all_reduce_perf (built outside the repository by
# scripts/build_nccl_tests.sh), carried as .carry/all_reduce_perf (comm's reference).
cmd_carry() {
  set -e
  local build=${FERRY_BUILD_DIR:-build/default}
  # Unset, the default build is brought up to date first; set, the folder is taken as built.
  [ -n "${FERRY_BUILD_DIR:-}" ] || scripts/build.sh default >/dev/null
  rm -rf .carry && mkdir -p .carry
  for b in tools/ferry/ferry tests/ferry_bench_tests tests/ferry_device_tests tests/ferry_probe_tests \
           tests/ferry_trace_tests tests/ferry_core_tests tests/ferry_egress_tests tests/ferry_ingest_tests \
           tests/ferry_shim_tests tests/ferry_comm_tests src/c/libferry_c.so src/inject/libferry_inject.so; do
    strip -o ".carry/$(basename "$b")" "$build/$b"
  done
  if [ -n "${FERRY_BASELINE_DIR:-}" ]; then
    # The baseline build's CLI and injection library (trace-cost's variant base), whichever it built.
    [ -f "$FERRY_BASELINE_DIR/tools/ferry/ferry" ] || [ -f "$FERRY_BASELINE_DIR/src/inject/libferry_inject.so" ] ||
      die "carry: FERRY_BASELINE_DIR=$FERRY_BASELINE_DIR has neither tools/ferry/ferry nor src/inject/libferry_inject.so"
    if [ -f "$FERRY_BASELINE_DIR/tools/ferry/ferry" ]; then strip -o .carry/ferry_baseline "$FERRY_BASELINE_DIR/tools/ferry/ferry"; fi
    if [ -f "$FERRY_BASELINE_DIR/src/inject/libferry_inject.so" ]; then
      strip -o .carry/baseline_inject.so "$FERRY_BASELINE_DIR/src/inject/libferry_inject.so"
    fi
  fi
  if [ -n "${FERRY_NCCL_TESTS:-}" ]; then
    cp "$FERRY_NCCL_TESTS" .carry/all_reduce_perf
  fi
  python3 "$here/carry_ctest.py" --build "$build" --source . --carry .carry
  git describe --always --dirty > .carry/commit
  du -sh .carry
}

# ---------------------------------------------------------------------------------------------- tests
# The carried tests of one label, with the filters, environment and skips tests/CMakeLists.txt gives
# them; ARGS go to ctest (-R NAME, -j N, ...), the environment to the tests (GTEST_FILTER narrows a test
# that names no filter of its own; PYTEST_ADDOPTS a pytest run; NCCL_P2P_DISABLE=1 moves NCCL off
# NVLink). The log is $OUT/ctest_LABEL.log.
cmd_tests() {
  local label=${1:-gpu}
  shift || true
  if [ "$dry" = 1 ]; then show log tests ctest --test-dir "$c" --output-on-failure -L "^${label}\$" "$@"; return 0; fi
  local out=${OUT:-/tmp/ferry-out}
  mkdir -p "$out"
  find_ctest
  nvidia_libs
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "date: $(date -u +%FT%TZ)  commit: $(cat "$c/commit" 2>/dev/null)  ctest: $CTEST"
  "$CTEST" --test-dir "$c" --output-on-failure -L "^${label}\$" "$@" 2>&1 | tee "$out/ctest_$label.log"
  local status=${PIPESTATUS[0]}
  # ctest names the failed test (a whole binary); GoogleTest's own lines in its output name the cases.
  if grep -q '^\[  FAILED  \] [A-Za-z]' "$out/ctest_$label.log"; then
    echo "failed cases:"
    grep '^\[  FAILED  \] [A-Za-z]' "$out/ctest_$label.log" | sed 's/ ([0-9]* ms)$//' | sort -u
  fi
  return "$status"
}

# ------------------------------------------------------------------------------------------- ladders
wl_ladders() {
  local what=$1 path run bin runs=(new)
  begin "ladders-$what"
  step topology "$c/ferry" probe --topology
  json topology_json "$c/ferry" probe --topology --json
  if carried ferry_baseline; then runs+=(baseline); fi
  for path in egress ingest; do
    [ "$what" = all ] || [ "$what" = "$path" ] || continue
    # Interleaved with the baseline, so a change's effect on the figures is measured in one minute.
    for run in "${runs[@]}"; do
      bin="$c/ferry"
      [ "$run" = baseline ] && bin="$c/ferry_baseline"
      json "$path-$run" "$bin" bench "$path" --backend cuda --json
    done
  done
  if [ "$what" != ingest ]; then
    json egress-pure_copy "$c/ferry" bench egress --backend cuda --pure-copy 20 --workers 14 --json
  fi
  finish ladders "${runs[@]}"
}

# ------------------------------------------------------------------------------------------ examples
wl_examples() {
  local what=$1 seg_levels train_levels
  python_env
  seg_levels=${SEG_LEVELS:-ideal,L0,L1,L2,L3,L4,L4-pinned,L4-pinned-nocopy,ferry}
  train_levels=${TRAIN_LEVELS:-ideal,loader,pinned,reference,ferry}
  begin "examples-$what"
  local seg_args train_args
  read -ra seg_args <<< "${SEG_ARGS:-}"
  read -ra train_args <<< "${TRAIN_ARGS:-}"
  if [ "$what" != train ]; then
    step segmentation python3 examples/pytorch/segmentation_egress.py --levels "$seg_levels" \
      ${seg_args[@]+"${seg_args[@]}"} --json "$work/segmentation.json"
  fi
  if [ "$what" != seg ]; then
    step train-allcpu python3 examples/pytorch/train_prefetch.py --levels "$train_levels" \
      ${train_args[@]+"${train_args[@]}"} --json "$work/train-allcpu.json"
    step train-4cpu python3 examples/pytorch/train_prefetch.py --levels "$train_levels" --cpus 4 \
      ${train_args[@]+"${train_args[@]}"} --json "$work/train-4cpu.json"
  fi
  finish tails 24 segmentation train-allcpu train-4cpu
}

# ------------------------------------------------------------------------------------------- vit-ddp
# Each run into its own folder of the work folder (results.json; its log beside it as vit-NAME.log).
wl_vit_ddp() {
  local what=$1 gpus levels profile vit_args
  gpus=${FERRY_GPUS:-2}
  levels=${VIT_LEVELS:-all}
  profile=${VIT_PROFILE:-ferry}
  read -ra vit_args <<< "${VIT_ARGS:-}"
  nvidia_libs
  python_env
  begin "vit-ddp-$what"
  # vit_run NAME P2P ARGS...: one torch.distributed.run of the example into $work/NAME.
  vit_run() {
    local run=$1 p2p=$2
    shift 2
    mk "$work/$run"
    step "vit-$run" env NCCL_P2P_DISABLE="$p2p" python3 -m torch.distributed.run --standalone \
      --nproc_per_node "$gpus" examples/pytorch/vit_ddp.py --out "$work/$run" "$@" ${vit_args[@]+"${vit_args[@]}"}
  }
  if [ "$what" = all ] || [ "$what" = nvlink ]; then
    if [ "$profile" = none ]; then
      vit_run nvlink 0 --levels "$levels"
    else
      vit_run nvlink 0 --levels "$levels" --profile "$profile"
    fi
  fi
  if [ "$what" = all ] || [ "$what" = p2p_off ]; then
    vit_run p2p_off 1 --levels "$levels"
  fi
  if [ "$what" = all ] || [ "$what" = convergence ]; then
    vit_run convergence 0 --convergence "${VIT_CONV_STEPS:-300}" --model "${VIT_CONV_MODEL:-vit_b_32}" \
      --levels "${VIT_CONV_LEVELS:-ddp,ddp_bf16,ferry,ferry_lossy}"
  fi
  finish vit-ddp
}

# ---------------------------------------------------------------------------------------------- comm
wl_comm() {
  local what=$1 gpus link p2p
  nvidia_libs
  [ "$what" = local ] && { comm_local; return; }
  gpus=${FERRY_GPUS:-2}
  begin "comm-$what"
  step topo nvidia-smi topo -m
  for link in nvlink p2p_off; do
    p2p=0
    [ "$link" = p2p_off ] && p2p=1
    if [ "$what" = all ] || [ "$what" = allreduce ]; then
      json "allreduce_$link" env NCCL_P2P_DISABLE=$p2p "$c/ferry" bench allreduce --backend cuda --gpus "$gpus" \
        -b 1M -e 2G -f 2 -n 20 -w 5 --codec fp32,bf16 --json
      if carried all_reduce_perf; then
        step "nccl_tests_$link" env NCCL_P2P_DISABLE=$p2p "$c/all_reduce_perf" -b 1M -e 2G -f 2 -g "$gpus" \
          -n 20 -w 5 -c 1
      fi
      json "torch_$link" env NCCL_P2P_DISABLE=$p2p python3 "$here/torch_allreduce.py" --gpus "$gpus" \
        -b 1M -e 2G -f 2 -n 20 -w 5
      # From 8 B over an mpirun job of one process per GPU: what the one-process group owes to its threads.
      on_path mpirun && json "allreduce_mpi_$link" env NCCL_P2P_DISABLE=$p2p "${mpi[@]}" -n "$gpus" -x NCCL_P2P_DISABLE "$c/ferry" \
        bench allreduce --bootstrap mpi -b 8 -e 2G -f 4 -n 20 -w 5 --json
    fi
    if [ "$what" = all ] || [ "$what" = ddp ]; then
      json "ddp_$link" env NCCL_P2P_DISABLE=$p2p "$c/ferry" bench ddp --backend cuda --gpus "$gpus" --json
      on_path mpirun && json "ddp_mpi_$link" env NCCL_P2P_DISABLE=$p2p "${mpi[@]}" -n "$gpus" -x NCCL_P2P_DISABLE "$c/ferry" \
        bench ddp --bootstrap mpi --json
    fi
  done
  finish comm
}

# comm local, on one GPU: what ferry's communication path costs where no link hides it (NCCL at world
# size 1 copies nothing in place); each carried CLI (ferry, ferry_baseline, ferry_v*) runs the first two.
comm_local() {
  local levels v variants=(ferry)
  levels=${FERRY_LEVELS:-single,25MB,100MB,bf16,auto}
  begin comm-local
  if carried ferry_baseline; then variants+=(ferry_baseline); fi
  if [ "$dry" = 0 ]; then
    for v in "$c"/ferry_v*; do [ -x "$v" ] && variants+=("$(basename "$v")"); done
  fi
  for v in "${variants[@]}"; do
    json "allreduce_1gpu_$v" "$c/$v" bench allreduce --backend cuda --gpus 1 -b 8 -e 1G -f 4 -n 100 -w 10 \
      --codec fp32,bf16 --json
    json "ddp_1gpu_$v" "$c/$v" bench ddp --backend cuda --gpus 1 --levels "$levels" --json
  done
  if carried all_reduce_perf; then
    step nccl_tests_1gpu "$c/all_reduce_perf" -b 8 -e 64M -f 4 -g 1 -n 100 -w 10 -c 1
  fi
  mk "$work/trace"
  json ddp_1gpu_traced "$c/ferry" bench ddp --backend cuda --gpus 1 --levels "${FERRY_TRACE_LEVELS:-$levels}" \
    --trace "$work/trace/ddp.json" --json
  finish comm-local "${variants[@]}"
}

# -------------------------------------------------------------------------------------------- loader
wl_loader() {
  local what=$1 tag loader_args
  python_env
  begin "loader-$what"
  read -ra loader_args <<< "${LOADER_ARGS:-}"
  if [ "$what" = jpeg ]; then
    # The JPEGs are made once under /tmp/ferry-jpeg.
    tag=${LOADER_CPUS:+-${LOADER_CPUS}cpu}
    step "loader-jpeg$tag" python3 examples/pytorch/loader_jpeg.py --workers "${LOADER_WORKERS:-4,8,14}" \
      --data /tmp/ferry-jpeg ${LOADER_CPUS:+--cpus "$LOADER_CPUS"} ${loader_args[@]+"${loader_args[@]}"} \
      --json "$work/loader-jpeg$tag.json"
    finish tails 24 "loader-jpeg$tag"
  else
    step loader-train-4cpu python3 examples/pytorch/train_prefetch.py --cpus 4 \
      --levels ideal,loader,reference,ferry,ferry_loader --json "$work/loader-train-4cpu.json"
    finish tails 24 loader-train-4cpu
  fi
}

# --------------------------------------------------------------------------------------------- trace
# `ferry trace` and the in-process recorder on the GPU (see WORKLOADS); the recordings stay in the tgz.
trace_env() {
  nvidia_libs
  python_env
  export FERRY_TRACE_SITE="$PWD/python/ferry/_trace_site" FERRY_LIBRARY="$abs_c/libferry_c.so"
  f="$abs_c/ferry"
}

wl_trace() {
  local what=$1 f bench part lvl parts
  trace_env
  # SMOKE_PARTS: which of bench (egress and ingest L1 against the in-process recorder), kineto
  # (torch.profiler inside a recorded program), seg and train (the PyTorch examples) smoke runs.
  read -ra parts <<< "${SMOKE_PARTS:-bench kineto seg train}"
  for part in "${parts[@]}"; do
    case $part in bench | kineto | seg | train) ;;
      *) die "trace smoke: unknown part '$part' in SMOKE_PARTS (bench kineto seg train, separated by spaces)" ;;
    esac
  done
  begin "trace-$what"
  if [ "$what" = smoke ]; then
    for part in "${parts[@]}"; do
      case $part in
        bench)
          for bench in egress ingest; do
            step "inproc-$bench" "$f" bench $bench --backend cuda --levels L1 --steps 20 --trace "$work/inproc/$bench.json"
            step "traced-$bench" "$f" trace -o "$work/$bench" -- "$f" bench $bench --backend cuda --levels L1 --steps 20
            step "$bench-analysis" "$f" analyze "$work/$bench"
            step "inproc-$bench-analysis" "$f" analyze "$work/inproc/$bench.L1.json"
            step "parity-$bench" python3 "$here/trace_parity.py" "$work/inproc/$bench.L1.json" "$work/$bench"
          done ;;
        kineto)
          step kineto "$f" trace -o "$work/kineto" -- python3 tests/inject/kineto_inside.py
          step kineto-analysis "$f" analyze "$work/kineto" ;;
        seg)
          step seg "$f" trace -o "$work/seg" -- python3 examples/pytorch/segmentation_egress.py \
            --levels "${SEG_LEVEL:-L1}" --steps 8
          step seg-analysis "$f" analyze "$work/seg" ;;
        train)
          step train "$f" trace -o "$work/train" -- python3 examples/pytorch/train_prefetch.py \
            --levels "${TRAIN_LEVEL:-loader}" --steps 20
          step train-analysis "$f" analyze "$work/train" ;;
      esac
    done
    finish trace-smoke "${parts[@]}"
  elif [ "$what" = findings ]; then
    # One level per recording, each recorded unmodified.
    for lvl in ${SEG_LEVELS:-L0 L1 L2 L3 L4 L4-pinned ferry}; do
      step "seg-$lvl" "$f" trace -o "$work/seg-$lvl" -- python3 examples/pytorch/segmentation_egress.py \
        --levels "$lvl" --steps 6
      step "seg-$lvl-analysis" "$f" analyze "$work/seg-$lvl"
      drop "$work/seg-$lvl"/*.ferry-proc
    done
    for lvl in ${TRAIN_LEVELS:-loader pinned reference ferry}; do
      step "train-$lvl" "$f" trace -o "$work/train-$lvl" -- python3 examples/pytorch/train_prefetch.py \
        --levels "$lvl" --steps 20
      step "train-$lvl-analysis" "$f" analyze "$work/train-$lvl"
      drop "$work/train-$lvl"/*.ferry-proc
    done
    finish trace-findings
  else
    json ingest_ladder "$f" bench ingest --backend cuda --json --trace "$work/ingest_trace.json"
    json egress_ladder "$f" bench egress --backend cuda --json --trace "$work/egress_trace.json"
    step naive python3 examples/pytorch/naive_loop.py --out "$work/kineto_naive.json"
    step kineto_naive "$f" analyze "$work/kineto_naive.json" --html "$work/kineto_naive.html"
    finish trace-ladders
  fi
}

# ---------------------------------------------------------------------------------------- trace-cost
# Sets pre to the `ferry trace` command (binary $f) that recording-cost variant $1 runs under, recording into
# $2: traced the defaults; lite, nosync, nopy, noblock leave one kind of evidence out; allcalls, slowflush,
# base (the baseline build's library) and deferred (the records converted outside CUPTI's callback) change
# how it is recorded; empty for plain and kineto (no ferry trace); kinetosync sets only FERRY_KINETO_SYNC=1
# (torch.profiler with its synchronization records, through tests/inject/under_kineto.py).
VARIANTS="plain traced lite nosync allcalls nopy noblock slowflush base deferred kineto kinetosync"
set_trace_prefix() {
  local flags=()
  case $1 in
    traced) ;;
    lite) flags=(--lite) ;;
    nosync) flags=(--no-syncs) ;;
    allcalls) flags=(--all-runtime-calls) ;;
    nopy) flags=(--python none) ;;
    noblock) flags=(--block-us 10000000) ;;
    slowflush) flags=(--flush-ms 1000) ;;
    base) # the defaults with the baseline build's injection library (carry with FERRY_BASELINE_DIR)
      [ "$dry" = 1 ] || [ -f "$abs_c/baseline_inject.so" ] ||
        die "trace-cost: variant base needs $c/baseline_inject.so (carry with FERRY_BASELINE_DIR)"
      pre=(env "FERRY_INJECT_LIBRARY=$abs_c/baseline_inject.so" "$f" trace -o "$2" --)
      return ;;
    deferred) # CUPTI's records converted on the writer thread, outside CUPTI's callback
      pre=(env FERRY_TRACE_DEFER_CONVERSION=1 "$f" trace -o "$2" --)
      return ;;
    plain | kineto) pre=(); return ;;
    kinetosync) pre=(env FERRY_KINETO_SYNC=1); return ;;
    *) die "trace-cost: unknown variant '$1' ($VARIANTS)" ;;
  esac
  pre=("$f" trace ${flags[@]+"${flags[@]}"} -o "$2" --)
}

# The variants of TRACE_VARIANTS (default $1) after plain, in round $2's order: alternate rounds run them
# in reverse (ABBA), so that a machine that drifts over the call weighs on every variant alike.
round_order() {
  local order
  # shellcheck disable=SC2086  # one word per variant
  order=$(printf '%s\n' plain ${TRACE_VARIANTS:-$1})
  if [ $(($2 % 2)) = 0 ]; then printf '%s\n' "$order" | tac; else printf '%s\n' "$order"; fi
}

wl_trace_cost() {
  local what=$1 f r v i pre args
  trace_env
  local variants
  read -ra variants <<< "${TRACE_VARIANTS:-}"
  for v in "${variants[@]}"; do
    case " $VARIANTS " in *" $v "*) ;; *) die "trace-cost: unknown variant '$v' ($VARIANTS)" ;; esac
    [ "$what" = api ] && [ "$v" = kinetosync ] &&
      die "trace-cost api: variant kinetosync is for program runs (api_cost.py has only --kineto cuda)"
  done
  if [ "$what" = bench ]; then
    begin trace-cost-bench
    # The egress ladder's ideal and ferry rows, plain and traced, alternating.
    for i in $(seq 1 "${FERRY_COST_ROUNDS:-3}"); do
      json "cost_plain_$i" "$f" bench egress --backend cuda --levels ideal,ferry --probed-d2h 55 --json
      json "cost_traced_$i" "$f" bench egress --backend cuda --levels ideal,ferry --probed-d2h 55 --json \
        --trace "$work/trace_$i.json"
    done
    finish trace-cost-bench
    return
  fi
  if [ "$what" = api ]; then
    begin trace-cost-api
    for r in $(seq 1 "${TRACE_RUNS:-4}"); do
      for v in $(round_order "traced nosync lite kineto" "$r"); do
        pre=() args=(--json "$work/cost-$v-$r.json")
        set_trace_prefix "$v" "$work/trace-$v-$r"
        [ "$v" = kineto ] && args+=(--kineto cuda)
        step "cost-$v-$r" ${pre[@]+"${pre[@]}"} python3 tests/inject/api_cost.py "${args[@]}"
        drop "$work/trace-$v-$r"
      done
    done
    finish trace-cost
    return
  fi
  # program: TRACE_SCRIPT (default examples/pytorch/TRACE_EXAMPLE, default train_prefetch.py) with
  # TRACE_ARGS, plain and under each variant, TRACE_RUNS rounds (6: as many in each order); TRACE_RANKS=N
  # through torch.distributed.run on N GPUs (its results.json). The first round's recordings are analyzed
  # (TRACE_ANALYZE=0 skips it: tens of seconds each) and listed by CUDA call (scripts/trace_calls.py).
  local script=${TRACE_SCRIPT:-examples/pytorch/${TRACE_EXAMPLE:-train_prefetch.py}} launch run_cmd
  launch=(python3)
  [ -n "${TRACE_RANKS:-}" ] && launch=(python3 -m torch.distributed.run --standalone --nproc_per_node "$TRACE_RANKS")
  begin "trace-cost-program-$(basename "$script" .py)${TRACE_RANKS:+-x$TRACE_RANKS}"
  for r in $(seq 1 "${TRACE_RUNS:-6}"); do
    for v in $(round_order traced "$r"); do
      read -ra args <<< "${TRACE_ARGS:---levels ideal,ferry --steps 40}"
      if [ -n "${TRACE_RANKS:-}" ]; then args+=(--out "$work/run-$v-$r"); else args+=(--json "$work/cost-$v-$r.json"); fi
      pre=()
      set_trace_prefix "$v" "$work/trace-$v-$r"
      run_cmd=("$script")
      # torch.profiler inside: the MLP's own option, else (and always with syncs) a wrapper around the script.
      if [ "$v" = kineto ] && [ "$(basename "$script")" = mlp_launch_bound.py ]; then args+=(--kineto cuda)
      elif [ "$v" = kineto ] || [ "$v" = kinetosync ]; then run_cmd=(tests/inject/under_kineto.py "$script"); fi
      step "cost-$v-$r" ${pre[@]+"${pre[@]}"} "${launch[@]}" "${run_cmd[@]}" "${args[@]}"
      if [ -n "${TRACE_RANKS:-}" ] && [ "$dry" = 0 ]; then
        cp "$work/run-$v-$r/results.json" "$work/cost-$v-$r.json" 2>/dev/null
      fi
      case $v in plain | kineto | kinetosync) ;;  # nothing recorded
        *)
          if [ "$r" = 1 ] && [ "${TRACE_ANALYZE:-1}" != 0 ]; then
            step "analysis-$v" "$f" analyze "$work/trace-$v-$r"
            # The CUDA calls recorded per thread and step: what the variant instrumented.
            [ "$v" = lite ] || step "calls-$v" python3 "$here/trace_calls.py" "$work/trace-$v-$r" --top 6
          fi ;;
      esac
      # Only the first round's recordings are analyzed; the later ones (tens of MB each) are not kept.
      [ "$r" = 1 ] || drop "$work/trace-$v-$r"
    done
  done
  # The recordings themselves (tens of MB) stay behind: their analyses are in the archive.
  [ "$dry" = 1 ] || find "$work" \( -name trace.json -o -name '*.ferry-proc' \) -delete
  finish trace-cost
}

# ---------------------------------------------------------------------------------------------- main
if [ "${1:-}" = -n ] || [ "${1:-}" = --dry-run ]; then
  dry=1
  shift
fi
sub=${1:-help}
shift || true
case "$sub" in
  carry)
    [ "$dry" = 0 ] || die "carry has no dry run"
    cmd_carry "$@" ;;
  tests) cmd_tests "$@" ;;
  list) list_workloads ;;
  help | -h | --help) usage ;;
  *)
    removed "$sub"
    if modes=$(modes_of "$sub"); then
      mode=${1:-${modes%% *}}
      removed "$sub $mode"
      [ $# -le 1 ] || die "$sub: one mode at most (${modes// /, }), not '$*'"
      case " $modes " in *" $mode "*) ;; *) die "$sub: unknown mode '$mode' (${modes// /, })" ;; esac
      "wl_${sub//-/_}" "$mode"
    else
      usage >&2
      die "unknown subcommand '$sub'"
    fi
    ;;
esac
