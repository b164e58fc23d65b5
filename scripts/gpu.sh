#!/usr/bin/env bash
# The one entry point for work on the lent GPU machines (scripts/README.md says how a session uses it).
#
#   scripts/gpu.sh carry                    HERE: pack .carry/ (binaries + their CTest file) for the GPU machine
#   scripts/gpu.sh tests [LABEL] [ARGS...]  THERE: ctest -L LABEL (default gpu) over the carried tests
#   scripts/gpu.sh comm-tests               THERE, 2 GPUs: the multigpu tests, the comm tests with P2P off, ...
#   scripts/gpu.sh check                    THERE: gpu tests, compute-sanitizer, the egress ladder
#   scripts/gpu.sh verify                   THERE: gpu tests, the shim, topology, both ladders (A/B baseline)
#   scripts/gpu.sh trace-check              THERE: CUPTI conformance, recording cost, traced ladders
#   scripts/gpu.sh trace-inject [smoke|findings|cost|api] THERE: ferry trace -- CMD: parity, torch.profiler, examples; cost
#   scripts/gpu.sh comm [all|allreduce|ddp] THERE, 2 GPUs: bench allreduce/ddp against nccl-tests and PyTorch
#   scripts/gpu.sh one-gpu-comm             THERE, 1 GPU: allreduce/ddp local cost, traced
#   scripts/gpu.sh examples                 THERE: the two PyTorch side-by-side examples
#   scripts/gpu.sh loader tests|jpeg|train4  THERE: ferry.torch.Loader: its tests on the GPU, the JPEG
#                                           ResNet-50 side by side (LOADER_CPUS, LOADER_WORKERS), ResNet-18 --cpus 4
#   scripts/gpu.sh vit-ddp [all|nvlink|p2p_off|convergence]  THERE, 2 GPUs: ViT-L/32, DDP beside ferry
#   scripts/gpu.sh dp a|b|c|d               THERE: ferry.torch's data parallel, staged to fit 10-minute calls:
#                                           a smoke + NVLink, b P2P off + convergence + world size 1,
#                                           c local cost + comm tests + latency, d 4 GPUs, e a rerun of
#                                           local cost + NVLink, f the final main; $OUT/STAGE.tgz
#
# Every THERE subcommand runs from the repository root on the GPU machine with .carry/ made by `carry`,
# writes its raw outputs under $OUT (default /tmp/ferry-out; examples: ./gpu-examples-out) and prints a
# summary last. The test filters live in tests/CMakeLists.txt alone: the carried .carry/CTestTestfile.cmake
# (scripts/carry_ctest.py) holds them, so `tests` and the suites of the other subcommands run ctest by label.
set -uo pipefail
cd "$(dirname "$0")/.."
here=scripts
c=${FERRY_CARRY:-.carry}

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
}

die() {
  echo "gpu.sh: $*" >&2
  exit 2
}

# NCCL, cuBLAS and the other NVIDIA libraries from the GPU machine's nvidia-* Python packages.
# NVLink multicast stays off (a program that uses it can take the shared GPUs out of service).
nvidia_libs() {
  local dirs
  dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
  [ -n "$dirs" ] && export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export NCCL_NVLS_ENABLE=0
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

# ctest_step NAME CTEST-ARGS...: the carried tests that CTEST-ARGS select, log in $out/NAME.log, rc in rc[NAME].
declare -A rc
ctest_step() {
  local name=$1
  shift
  "$CTEST" --test-dir "$c" --output-on-failure "$@" > "$out/$name.log" 2>&1
  rc[$name]=$?
  echo "$name: rc ${rc[$name]}: $(grep -E 'tests passed|No tests were found' "$out/$name.log" | tail -n 1)"
  grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Subprocess aborted|Exception|Disabled)\)' \
    "$out/$name.log" || true
}

print_rcs() {
  for k in "${!rc[@]}"; do echo "rc $k=${rc[$k]}"; done | sort
}

# ---------------------------------------------------------------------------------------------- carry
# Packs what a run on the GPU machine needs into .carry/ (ignored by git): the stripped ferry CLI, the
# test binaries of the build (cuda backend, cudart static), libferry_c.so (for the Python package:
# FERRY_LIBRARY=.carry/libferry_c.so PYTHONPATH=python) and .carry/CTestTestfile.cmake, the build's tests
# with their paths made relative (scripts/carry_ctest.py), which also carries any other binary a gpu or
# multigpu test runs. The GPU machine has no GoogleTest, fmt or CLI11, so the binaries are built here.
# FERRY_BUILD_DIR: a build folder taken as built (unset: build/default, built first by scripts/build.sh).
# FERRY_BASELINE_DIR: another build folder, whose CLI is carried as .carry/ferry_baseline (verify and
# one-gpu-comm compare). FERRY_NCCL_TESTS: NVIDIA nccl-tests' all_reduce_perf (built outside the
# repository by scripts/build_nccl_tests.sh), carried as .carry/all_reduce_perf (comm's reference).
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
    # The baseline build's CLI and injection library (trace-inject's variant base), whichever it built.
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
# The carried tests of one label (gpu by default; multigpu on a machine of 2 or more GPUs; cpu works
# anywhere), with the filters, environment and skips tests/CMakeLists.txt gives them. ARGS go to ctest
# (-R NAME, -j N, ...).
cmd_tests() {
  local label=${1:-gpu}
  shift || true
  out=${OUT:-/tmp/ferry-out}
  mkdir -p "$out"
  find_ctest
  nvidia_libs
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$out/nvidia-smi.csv"
  echo "date: $(date -u +%FT%TZ)  commit: $(cat "$c/commit" 2>/dev/null)  ctest: $CTEST"
  "$CTEST" --test-dir "$c" --output-on-failure -L "^${label}\$" "$@" 2>&1 | tee "$out/ctest_$label.log"
}

# ----------------------------------------------------------------------------------------- comm-tests
# On a machine of 2 GPUs: the device-to-device path's tests. The multigpu label (peer copies, the NCCL
# communicator with its fault tests, the reducer over NCCL, NCCL over an mpirun job), the gpu-labelled comm
# tests (the codecs' kernels against the host code, PowerSGD on cuda over FERRY_GPUS GPUs), the NCCL tests
# again with NCCL_P2P_DISABLE=1, the MPI bootstrap's own test, the shim (NCCL, cuBLAS, MPI found there),
# then the local cost of the reducer and its codecs at world size 1 (`ferry bench ddp --gpus 1`).
cmd_comm_tests() {
  out=${OUT:-/tmp/ferry-out}
  mkdir -p "$out"
  find_ctest
  nvidia_libs
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
  echo "date: $(date -u +%FT%TZ)  commit: $(cat "$c/commit" 2>/dev/null)  NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  ctest_step multigpu -L '^multigpu$'
  FERRY_TEST_GPUS=${FERRY_GPUS:-2} ctest_step comm_gpu -L '^gpu$' -R '^comm_'
  NCCL_P2P_DISABLE=1 ctest_step comm_nccl_p2p_off -R '^comm_nccl$'
  ctest_step comm_mpi -R '^comm_mpi$'
  "$c/ferry_shim_tests" > "$out/shim.log" 2>&1
  rc[shim]=$?
  echo "shim: rc ${rc[shim]}: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/shim.log" | tr '\n' ' ')"
  "$c/ferry" bench ddp --backend cuda --gpus 1 --levels single,25MB,100MB,bf16,fp16,powersgd,auto \
    --json > "$out/ddp_world1.json" 2> "$out/ddp_world1.err"
  rc[ddp_world1]=$?
  echo "=== summary"
  print_rcs
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
}

# ---------------------------------------------------------------------------------------------- check
# The gpu-labelled tests, the egress tests under compute-sanitizer (memcheck, racecheck, synccheck) and the
# device tests under memcheck, `ferry probe`'s ladder companion: the egress ladder at the reference shape
# with its pure-copy mode.
cmd_check() {
  out=${OUT:-/tmp/ferry-out}
  mkdir -p "$out"
  find_ctest
  nvidia_libs
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
  echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  memlock: $(ulimit -l)  commit: $(cat "$c/commit" 2>/dev/null)"

  echo "=== egress ladder, reference shape"
  "$c/ferry" bench egress --backend cuda --json > "$out/egress.json" 2> "$out/egress.err"
  rc[ladder]=$?
  tail -n 3 "$out/egress.err"
  echo "=== egress pure copy"
  "$c/ferry" bench egress --backend cuda --pure-copy 20 --workers 14 --json > "$out/egress_pure_copy.json" 2>>"$out/egress.err"
  rc[pure_copy]=$?

  echo "=== gpu tests"
  ctest_step gpu_tests -L '^gpu$'

  echo "=== compute-sanitizer"
  for tool in memcheck racecheck synccheck; do
    FERRY_TEST_BACKENDS=cuda timeout 100 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 99 \
      "$c/ferry_egress_tests" --gtest_filter='*egress_pipeline*cuda*' > "$out/tmp_$tool.log" 2>&1
    rc[egress_$tool]=$?
    { echo "=== $tool"; cat "$out/tmp_$tool.log"; } >> "$out/sanitizer.log"
    tail -n 2 "$out/tmp_$tool.log"
    rm -f "$out/tmp_$tool.log"
  done
  FERRY_TEST_BACKENDS=cuda timeout 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
    "$c/ferry_device_tests" --gtest_filter='*cuda*' > "$out/tmp_device.log" 2>&1
  rc[device_memcheck]=$?
  { echo "=== device memcheck"; cat "$out/tmp_device.log"; } >> "$out/sanitizer.log"
  rm -f "$out/tmp_device.log"

  echo "=== summary"
  print_rcs
  python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
try:
    j = json.load(open(os.path.join(out, "egress.json")))
    print(f'egress ladder on {j["device"]["name"]}: probed pinned D2H {j["probed_d2h_gbps"]:.2f} GB/s')
    for r in j["rows"]:
        # The ceiling (ideal) moves and checks nothing: its link figures and mismatch count are null.
        gbps = "-" if r["d2h_gbps"] is None else f'{r["d2h_gbps"]:.2f}'
        link = "-" if r["link_fraction"] is None else f'{100*r["link_fraction"]:.1f}'
        bad = "-" if r["mismatches"] is None else r["mismatches"]
        print(f'  {r["level"]:<10} {r["steps_per_s"]:7.3f} steps/s  x{r["ratio_to_ideal"]:.3f}  '
              f'{gbps:>6} GB/s  {link:>5}% link  idle {100*r["gpu_idle"]:5.1f}%  '
              f'mismatch {bad}')
except Exception as e:
    print("egress.json unreadable:", e)
try:
    p = json.load(open(os.path.join(out, "egress_pure_copy.json")))
    print(f'pure copy: {p["gbps"]:.2f} GB/s end to end, {p["copy_gbps"]:.2f} GB/s copies, '
          f'{100*p["link_fraction"]:.1f}% of {p["probed_d2h_gbps"]:.2f}; mismatches {p["mismatches"]}')
except Exception as e:
    print("egress_pure_copy.json unreadable:", e)
PY
}

# --------------------------------------------------------------------------------------------- verify
# The gpu-labelled tests, CUPTI tracing and NVML topology through the run-time shim, and one run of each
# ladder at the reference shape. When .carry/ferry_baseline exists (the CLI of an earlier commit,
# FERRY_BASELINE_DIR=... scripts/gpu.sh carry), both ladders run with it too, interleaved, so a change's
# effect on the figures is measured on one machine in one session.
cmd_verify() {
  out=${OUT:-/tmp/ferry-out}
  mkdir -p "$out"
  find_ctest
  nvidia_libs
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
  echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat "$c/commit" 2>/dev/null)"

  echo "=== gpu tests (cuda backend)"
  ctest_step gpu_tests -L '^gpu$'

  echo "=== NVML and CUPTI through the shim"
  # The CLI must not link CUPTI: the shim loads it at run time.
  if readelf -d "$c/ferry" | grep -i "cupti"; then rc[links_cupti]=1; else rc[links_cupti]=0; fi
  "$c/ferry_shim_tests" > "$out/shim.log" 2>&1
  rc[suite_shim]=$?
  tail -n 1 "$out/shim.log"
  "$c/ferry" probe --topology > "$out/topology.txt" 2>&1
  rc[topology_text]=$?
  "$c/ferry" probe --topology --json > "$out/topology.json" 2> "$out/topology.err"
  rc[topology]=$?
  "$c/ferry" bench egress --backend cuda --levels ideal,ferry --steps 3 --trace "$out/t/egress.json" \
    > "$out/traced.txt" 2>&1
  rc[traced]=$?
  grep -A3 "trace analysis" "$out/traced.txt" | head -n 5

  local runs=(new) path run bin
  [ -x "$c/ferry_baseline" ] && runs+=(baseline)
  for path in egress ingest; do
    for run in "${runs[@]}"; do
      bin="$c/ferry"
      [ "$run" = baseline ] && bin="$c/ferry_baseline"
      echo "=== $path ladder ($run)"
      "$bin" bench "$path" --backend cuda --json > "$out/$path-$run.json" 2> "$out/$path-$run.err"
      rc[${path}_$run]=$?
    done
  done

  echo "=== summary"
  print_rcs
  python3 - "$out" "${runs[@]}" <<'PY'
import json, os, sys
out, runs = sys.argv[1], sys.argv[2:]
for path in ("egress", "ingest"):
    tables = {}
    for run in runs:
        try:
            tables[run] = {r["level"]: r for r in json.load(open(os.path.join(out, f"{path}-{run}.json")))["rows"]}
        except Exception as e:  # noqa: BLE001 - the table says which run is missing
            print(f"{path}-{run}.json unreadable: {e}")
    if not tables:
        continue
    print(f"{path}: ratio to ideal (steps/s)" + "".join(f"  {r:>18}" for r in tables))
    for level in next(iter(tables.values())):
        cells = []
        for run, rows in tables.items():
            r = rows.get(level)
            bad = r.get("mismatches", r.get("wrong", 0)) if r else 0
            cells.append(f"{r['ratio_to_ideal']:.3f} ({r['steps_per_s']:6.2f}){'!' if bad else ' '}" if r else "-")
        print(f"  {level:<10}" + "".join(f"  {c:>18}" for c in cells))
PY
}

# ---------------------------------------------------------------------------------------- trace-check
# The tracing checks: (1) the CUPTI recorder's conformance tests on cuda (device_cuda's trace tests);
# (2) the recording cost: the egress ladder's ideal and ferry rows with and without --trace, alternating
# (FERRY_COST_ROUNDS rounds, default 3); (3) both ladders with --trace at the reference shapes (each level's
# bottleneck named); (4) a PyTorch profiler trace of a naive loop, analyzed; (5) ferry probe --topology.
# Raw outputs go to $OUT/trace-check.tar.gz.
cmd_trace_check() {
  out=${OUT:-/tmp/ferry-out}
  mkdir -p "$out"
  local work i
  work=$(mktemp -d)
  find_ctest
  echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat "$c/commit" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader | tee "$work/nvidia-smi.csv"

  echo "=== trace conformance on cuda"
  # device_cuda as tests/CMakeLists.txt declares it, narrowed to its trace tests.
  out=$work GTEST_FILTER='*trace*' ctest_step trace_tests -R '^device_cuda$'

  echo "=== topology"
  "$c/ferry" probe --topology > "$work/topology.txt" 2>&1
  rc[topology]=$?
  "$c/ferry" probe --topology --json > "$work/topology.json" 2>>"$work/topology.txt"
  rc[topology_json]=$?
  cat "$work/topology.txt"

  echo "=== recording cost: egress ideal+ferry, plain and traced, alternating (${FERRY_COST_ROUNDS:=3} rounds)"
  for i in $(seq 1 "$FERRY_COST_ROUNDS"); do
    "$c/ferry" bench egress --backend cuda --levels ideal,ferry --probed-d2h 55 --json > "$work/cost_plain_$i.json" 2>>"$work/cost.err"
    rc[cost_plain_$i]=$?
    "$c/ferry" bench egress --backend cuda --levels ideal,ferry --probed-d2h 55 --json \
      --trace "$work/cost_traced_$i.json" > "$work/cost_traced_summary_$i.json" 2>>"$work/cost.err"
    rc[cost_traced_$i]=$?
  done

  echo "=== ladders with --trace"
  "$c/ferry" bench ingest --backend cuda --json --trace "$work/ingest_trace.json" > "$work/ingest_ladder.json" 2> "$work/ingest_ladder.err"
  rc[ingest_ladder]=$?
  "$c/ferry" bench egress --backend cuda --json --trace "$work/egress_trace.json" > "$work/egress_ladder.json" 2> "$work/egress_ladder.err"
  rc[egress_ladder]=$?

  echo "=== PyTorch naive loop, analyzed"
  python3 examples/pytorch/naive_loop.py --out "$work/kineto_naive.json" > "$work/naive.log" 2>&1
  rc[torch]=$?
  "$c/ferry" analyze "$work/kineto_naive.json" --html "$work/kineto_naive.html" > "$work/kineto_naive.txt" 2>&1
  rc[analyze_torch]=$?
  head -n 40 "$work/kineto_naive.txt"

  echo "=== summary"
  print_rcs
  python3 - "$work" <<'PY'
import json, sys, os, glob
w = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception as e: print("unreadable", p, e); return None
plain, traced = [], []
for p in sorted(glob.glob(os.path.join(w, "cost_plain_*.json"))):
    j = load(p)
    if j: plain.append({r["level"]: r for r in j["rows"]})
for p in sorted(glob.glob(os.path.join(w, "cost_traced_summary_*.json"))):
    j = load(p)
    if j: traced.append({r["level"]: r for r in j["rows"]})
for name, runs in (("plain", plain), ("traced", traced)):
    for i, r in enumerate(runs):
        print(f'{name} {i+1}: ideal {r["ideal"]["steps_per_s"]:.4f}  ferry {r["ferry"]["steps_per_s"]:.4f} steps/s '
              f'x{r["ferry"]["ratio_to_ideal"]:.4f}  mismatches {r["ferry"]["mismatches"]}')
if plain and traced:
    mp = sum(r["ferry"]["steps_per_s"] for r in plain) / len(plain)
    mt = sum(r["ferry"]["steps_per_s"] for r in traced) / len(traced)
    print(f'recording cost on the ferry egress row: {100*(1-mt/mp):.2f}% (plain {mp:.4f}, traced {mt:.4f} steps/s)')
for lad in ("ingest", "egress"):
    j = load(os.path.join(w, f"{lad}_ladder.json"))
    if not j: continue
    for t in j.get("traces", []):
        ok = "ok" if t.get("bottleneck") == t.get("expected_finding") else "MISMATCH"
        print(f'{lad} {t["level"]:<10} events {t["events"]:>7} dropped {t["dropped"]}  bottleneck {t.get("bottleneck")}'
              f' (expected {t.get("expected_finding")}) {ok}')
    for r in j["rows"]:
        print(f'{lad} {r["level"]:<10} x{r["ratio_to_ideal"]:.3f} mismatches {r["mismatches"]}')
PY
  tar -C "$work" -czf "$out/trace-check.tar.gz" . && ls -la "$out"
}

# ----------------------------------------------------------------------------------------------- comm
# On a machine of 2 GPUs (FERRY_GPUS, default 2), for each link, NVLink and NCCL_P2P_DISABLE=1 (through
# host memory):
#   - `ferry bench allreduce` from 1 MiB to 2 GiB, fp32 and bf16, every element checked;
#   - the references at the same sizes: nccl-tests' all_reduce_perf (when carried) and PyTorch's
#     all_reduce (scripts/torch_allreduce.py);
#   - `ferry bench allreduce` again over two processes of an mpirun job (--bootstrap mpi, one GPU each),
#     from 8 B: what the one-process group's per-call cost owes to its threads;
#   - `ferry bench ddp`, every level, on the reference model and step (83 ms), in one process and again
#     over an mpirun job of one process per GPU (as DDP runs; its JSON only in raw.tgz and the summary).
# What comes back is ferry's JSON results, summary.txt and raw.tgz (every file, the references' outputs and
# the logs included), under the device tool's 8-file limit. Argument: all (default), allreduce or ddp.
cmd_comm() {
  local what=${1:-all} final out gpus link p2p
  case "$what" in all | allreduce | ddp) ;; *) die "comm: expected all, allreduce or ddp, not '$what'" ;; esac
  final=${OUT:-/tmp/ferry-out}
  out="$final/raw"
  mkdir -p "$out"
  gpus=${FERRY_GPUS:-2}
  nvidia_libs
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
  nvidia-smi topo -m > "$out/topo.txt" 2>&1
  echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat "$c/commit" 2>/dev/null)"

  for link in nvlink p2p_off; do
    p2p=""
    [ "$link" = p2p_off ] && p2p="NCCL_P2P_DISABLE=1"
    if [ "$what" = all ] || [ "$what" = allreduce ]; then
      echo "=== allreduce, $link"
      env $p2p "$c/ferry" bench allreduce --backend cuda --gpus "$gpus" -b 1M -e 2G -f 2 -n 20 -w 5 \
        --codec fp32,bf16 --json > "$out/allreduce_$link.json" 2> "$out/allreduce_$link.err"
      rc[allreduce_$link]=$?
      if [ -x "$c/all_reduce_perf" ]; then
        env $p2p "$c/all_reduce_perf" -b 1M -e 2G -f 2 -g "$gpus" -n 20 -w 5 -c 1 \
          > "$out/nccl_tests_$link.txt" 2>&1
        rc[nccl_tests_$link]=$?
      fi
      env $p2p python3 "$here/torch_allreduce.py" --gpus "$gpus" -b 1M -e 2G -f 2 -n 20 -w 5 \
        > "$out/torch_$link.json" 2> "$out/torch_$link.err"
      rc[torch_$link]=$?
      if command -v mpirun >/dev/null; then
        env $p2p OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -n "$gpus" -x LD_LIBRARY_PATH \
          -x NCCL_NVLS_ENABLE ${p2p:+-x NCCL_P2P_DISABLE} "$c/ferry" bench allreduce --bootstrap mpi -b 8 -e 2G \
          -f 4 -n 20 -w 5 --json > "$out/allreduce_mpi_$link.json" 2> "$out/allreduce_mpi_$link.err"
        rc[allreduce_mpi_$link]=$?
      fi
    fi
    if [ "$what" = all ] || [ "$what" = ddp ]; then
      echo "=== ddp, $link"
      env $p2p "$c/ferry" bench ddp --backend cuda --gpus "$gpus" --json > "$out/ddp_$link.json" 2> "$out/ddp_$link.err"
      rc[ddp_$link]=$?
      grep "plan of" "$out/ddp_$link.err"
      if command -v mpirun >/dev/null; then
        env $p2p OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -n "$gpus" -x LD_LIBRARY_PATH \
          -x NCCL_NVLS_ENABLE ${p2p:+-x NCCL_P2P_DISABLE} "$c/ferry" bench ddp --bootstrap mpi --json \
          > "$out/ddp_mpi_$link.json" 2> "$out/ddp_mpi_$link.err"
        rc[ddp_mpi_$link]=$?
      fi
    fi
  done

  echo "=== summary"
  print_rcs
  python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, os, sys
out = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception:  # noqa: BLE001 - the table says what is missing
        return None


def nccl_tests(name):
    """size -> out-of-place busbw from all_reduce_perf's table."""
    rows = {}
    try:
        for line in open(os.path.join(out, name)):
            f = line.split()
            if len(f) >= 8 and f[0].isdigit():
                rows[int(f[0])] = float(f[7])
    except OSError:
        pass
    return rows


for link in ("nvlink", "p2p_off"):
    ferry, torch, nt = load(f"allreduce_{link}.json"), load(f"torch_{link}.json"), nccl_tests(f"nccl_tests_{link}.txt")
    if ferry:
        fp32 = {r["size"]: r for r in ferry["rows"] if r["codec"] == "fp32"}
        bf16 = {r["size"]: r for r in ferry["rows"] if r["codec"] == "bf16"}
        tb = {r["size"]: r["busbw"] for r in torch["rows"]} if torch else {}
        print(f"all-reduce busbw GB/s, {link} (out of place; bf16: effbw of the fp32 bytes); #wrong {ferry['wrong']}")
        print(f"  {'size':>10} {'ferry':>8} {'nccl-t':>8} {'torch':>8} {'/nccl-t':>8} {'bf16 eff':>9}")
        for s, r in fp32.items():
            mine = r["out_of_place"]["busbw"]
            ref = nt.get(s)
            cell = lambda v: f"{v:8.1f}" if v else f"{'-':>8}"  # noqa: E731
            ratio = f"{mine / ref:8.3f}" if ref else f"{'-':>8}"
            eff = bf16[s]["out_of_place"]["effbw"] if s in bf16 else 0
            print(f"  {s:>10} {mine:8.1f} {cell(ref)} {cell(tb.get(s))} {ratio} {eff:9.1f}")
    for name in (f"ddp_{link}", f"ddp_mpi_{link}"):
        ddp = load(f"{name}.json")
        if ddp:
            print(f"{name}: steps/s, x single, hidden, exposed ms (auto: predicted), buckets (lossy), cap MiB, "
                  f"mismatches, then per step on the compute stream: forward, backward, gap before the next step (ms); "
                  f"auto: us a bucket takes from backward")
            for r in ddp["rows"]:
                pred = f" ({r['predicted_exposed_ms']:.2f})" if "predicted_exposed_ms" in r else ""
                per = f" {r['per_bucket_us']:.1f} us" if "per_bucket_us" in r else ""
                print(f"  {r['level']:<11} {r['steps_per_s']:7.3f} {r['ratio_to_ideal']:6.3f} {r.get('hidden', 0):6.1%} "
                      f"{r.get('exposed_ms', 0):7.2f}{pred} {r.get('buckets', 0):5d} ({r.get('lossy_buckets', 0)}) "
                      f"{r.get('cap_mib', 0):6.1f} {r['wrong']}  {r.get('forward_ms', 0):6.2f} {r.get('backward_ms', 0):6.2f} "
                      f"{r.get('between_ms', 0):5.2f}{per}")
PY
  local f
  for f in allreduce_nvlink.json allreduce_p2p_off.json allreduce_mpi_nvlink.json allreduce_mpi_p2p_off.json \
    ddp_nvlink.json ddp_p2p_off.json summary.txt; do
    [ -f "$out/$f" ] && cp "$out/$f" "$final/$f"
  done
  tar -czf "$final/raw.tgz" -C "$final" raw && rm -rf "$out"
}

# --------------------------------------------------------------------------------------- one-gpu-comm
# On a machine of one GPU: what ferry's communication path costs where no link hides it.
#   - `ferry bench allreduce --gpus 1` from 8 B to 1 GiB, fp32 and bf16: the cost of one call (NCCL at
#     world size 1 copies nothing in place) and the codecs' own time, beside nccl-tests' all_reduce_perf
#     -g 1 when carried;
#   - `ferry bench ddp --gpus 1`: the reducer's and the codecs' local cost a step (ceiling: `single`);
#   - the same ddp levels again with --trace: the CUPTI timeline of each level and its analysis.
# With FERRY_BASELINE_DIR given to `carry`, .carry/ferry_baseline (and any other carried .carry/ferry_v*)
# runs the first two as well, for an A/B of the same machine and minute. raw.tgz holds every file.
# FERRY_LEVELS: the ddp levels; FERRY_TRACE_LEVELS: the traced ones (default: the same).
cmd_one_gpu_comm() {
  local final out levels variants v
  final=${OUT:-/tmp/ferry-out}
  out="$final/raw"
  mkdir -p "$out/trace"
  nvidia_libs
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
  echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat "$c/commit" 2>/dev/null)"
  levels=${FERRY_LEVELS:-single,25MB,100MB,bf16,auto}
  variants="ferry"
  for v in ferry_baseline $(cd "$c" && ls -d ferry_v* 2>/dev/null); do
    [ -x "$c/$v" ] && variants="$variants $v"
  done
  for v in $variants; do
    echo "=== $v: allreduce, 1 GPU"
    "$c/$v" bench allreduce --backend cuda --gpus 1 -b 8 -e 1G -f 4 -n 100 -w 10 --codec fp32,bf16 --json \
      > "$out/allreduce_1gpu_$v.json" 2> "$out/allreduce_1gpu_$v.err"
    rc[allreduce_$v]=$?
    echo "=== $v: ddp, 1 GPU ($levels)"
    "$c/$v" bench ddp --backend cuda --gpus 1 --levels "$levels" --json \
      > "$out/ddp_1gpu_$v.json" 2> "$out/ddp_1gpu_$v.err"
    rc[ddp_$v]=$?
  done
  if [ -x "$c/all_reduce_perf" ]; then
    "$c/all_reduce_perf" -b 8 -e 64M -f 4 -g 1 -n 100 -w 10 -c 1 > "$out/nccl_tests_1gpu.txt" 2>&1
    rc[nccl_tests]=$?
  fi
  echo "=== ferry: ddp, 1 GPU, traced"
  "$c/ferry" bench ddp --backend cuda --gpus 1 --levels "${FERRY_TRACE_LEVELS:-$levels}" \
    --trace "$out/trace/ddp.json" --json > "$out/ddp_1gpu_traced.json" 2> "$out/ddp_1gpu_traced.err"
  rc[ddp_traced]=$?

  tar -czf "$final/raw.tgz" -C "$out" .
  {
    print_rcs
    # shellcheck disable=SC2086  # one argument per variant
    python3 - "$out" $variants <<'PY'
import json, sys, os
out = sys.argv[1]
for v in sys.argv[2:]:
    p = f"{out}/allreduce_1gpu_{v}.json"
    if os.path.exists(p) and os.path.getsize(p):
        rows = json.load(open(p)).get("rows", [])
        print(f"{v} allreduce us/call (out of place):",
              " ".join(f"{r['size']}:{r['out_of_place']['time_us']:.1f}" for r in rows))
    p = f"{out}/ddp_1gpu_{v}.json"
    if os.path.exists(p) and os.path.getsize(p):
        for r in json.load(open(p)).get("rows", []):
            print(f"{v} ddp {r['level']}: {r['steps_per_s']:.3f} steps/s ratio {r['ratio_to_ideal']:.4f}"
                  f" buckets {r.get('buckets')} backward {r.get('backward_ms', 0):.2f} ms wrong {r['wrong']}")
PY
    grep -E "^ +[0-9]+ " "$out/nccl_tests_1gpu.txt" 2>/dev/null | awk '{print "nccl-tests", $1, $6}'
  } | tee "$final/summary.txt"
}

# ------------------------------------------------------------------------------------------- examples
# The two PyTorch side-by-side examples, their --json and logs left in $OUT (default ./gpu-examples-out):
# examples/pytorch/segmentation_egress.py (the device-to-host ladder beside ferry.torch.Egress) and
# examples/pytorch/train_prefetch.py (training input with all cores and with 4).
#   scripts/gpu.sh examples                                          # every level of both
#   SEG_LEVELS=ideal,ferry TRAIN_LEVELS=ideal,ferry scripts/gpu.sh examples
# ferry's levels need its Python package: python/ on PYTHONPATH and libferry_c.so where the package looks
# for it (FERRY_LIBRARY, or .carry/libferry_c.so when present). SEG_ARGS, TRAIN_ARGS: more arguments;
# TAG: a suffix for the output files; a level list of `none` skips that example.
cmd_examples() {
  local out seg_levels train_levels seg_args train_args tag status=0
  out=${OUT:-gpu-examples-out}
  mkdir -p "$out"
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  [ -z "${FERRY_LIBRARY:-}" ] && [ -f "$c/libferry_c.so" ] && export FERRY_LIBRARY="$PWD/$c/libferry_c.so"
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

  if [ "$seg_levels" != none ]; then
    # shellcheck disable=SC2086
    python3 examples/pytorch/segmentation_egress.py --levels "$seg_levels" $seg_args \
      --json "$out/segmentation${tag}.json" 2>&1 | tee "$out/segmentation${tag}.log" || status=1
  fi
  if [ "$train_levels" != none ]; then
    # shellcheck disable=SC2086
    python3 examples/pytorch/train_prefetch.py --levels "$train_levels" $train_args \
      --json "$out/train-allcpu${tag}.json" 2>&1 | tee "$out/train-allcpu${tag}.log" || status=1
    # shellcheck disable=SC2086
    python3 examples/pytorch/train_prefetch.py --levels "$train_levels" --cpus 4 $train_args \
      --json "$out/train-4cpu${tag}.json" 2>&1 | tee "$out/train-4cpu${tag}.log" || status=1
  fi
  return $status
}

# ------------------------------------------------------------------------------------------------ loader
# ferry.torch.Loader on the GPU. tests: tests/python/test_loader.py on the host and cuda backends (a memfd
# registered with cudaHostRegister, written by forked workers, copied by the copy engine) and the slot
# feed's C++ tests on cuda. jpeg: examples/pytorch/loader_jpeg.py (LOADER_WORKERS, default 4,8,14;
# LOADER_CPUS limits the cores; LOADER_ARGS more options), the JPEGs made once under /tmp/ferry-jpeg.
# train4: examples/pytorch/train_prefetch.py --cpus 4 with the Loader beside the DataLoader levels.
cmd_loader() {
  local what=${1:-tests} out status=0 tag
  out=${OUT:-/tmp/ferry-out}
  mkdir -p "$out"
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  [ -z "${FERRY_LIBRARY:-}" ] && [ -f "$c/libferry_c.so" ] && export FERRY_LIBRARY="$PWD/$c/libferry_c.so"
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    nproc
    python3 -c 'import torch, torchvision, PIL; print("torch", torch.__version__, "torchvision", torchvision.__version__, "PIL", PIL.__version__)'
  } 2>&1 | tee "$out/loader-machine.txt"
  case "$what" in
    tests)
      FERRY_TEST_BACKENDS=host,cuda python3 -m pytest -q -p no:cacheprovider tests/python/test_loader.py 2>&1 |
        tee "$out/loader-tests.log" || status=1
      FERRY_TEST_BACKENDS=cuda "$c/ferry_ingest_tests" --gtest_filter='*ingest_feed*' 2>&1 |
        tee "$out/loader-feed-tests.log" || status=1
      ;;
    jpeg)
      tag=${LOADER_CPUS:+-${LOADER_CPUS}cpu}
      # shellcheck disable=SC2086
      python3 examples/pytorch/loader_jpeg.py --workers "${LOADER_WORKERS:-4,8,14}" --data /tmp/ferry-jpeg \
        ${LOADER_CPUS:+--cpus "$LOADER_CPUS"} ${LOADER_ARGS:-} --json "$out/loader-jpeg${tag}.json" 2>&1 |
        tee "$out/loader-jpeg${tag}.log" || status=1
      ;;
    train4)
      python3 examples/pytorch/train_prefetch.py --cpus 4 --levels ideal,loader,reference,ferry,ferry_loader \
        --json "$out/loader-train-4cpu.json" 2>&1 | tee "$out/loader-train-4cpu.log" || status=1
      ;;
    *) die "loader: expected tests, jpeg or train4, not '$what'" ;;
  esac
  return $status
}

# ------------------------------------------------------------------------------------------ trace-inject
# `ferry trace` on the GPU: smoke (parity of kernels and copies per step with the in-process recorder on
# the egress and ingest ladders' L1, torch.profiler inside a recorded program, two examples recorded and
# analyzed), findings (each reference level of the PyTorch examples recorded unmodified, its first finding)
# or cost (a program run plain and under `ferry trace`, interleaved, TRACE_RUNS times; see the cost branch).
# Raw outputs in $OUT/trace-inject-*.tgz and the summary beside it.
# Sets pre to the `ferry trace` command (binary $f) that recording-cost variant $1 runs under, recording into
# $2: traced the defaults; lite, nosync, nopy, noblock leave one kind of evidence out; allcalls, slowflush,
# base (the baseline build's library) and deferred (the records converted outside CUPTI's callback) change
# how it is recorded; empty for plain and kineto (no ferry trace); kinetosync sets only FERRY_KINETO_SYNC=1
# (torch.profiler with its synchronization records, through tests/inject/under_kineto.py).
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
      [ -f "$PWD/$c/baseline_inject.so" ] || die "trace-inject: variant base needs $c/baseline_inject.so (carry with FERRY_BASELINE_DIR)"
      pre=(env "FERRY_INJECT_LIBRARY=$PWD/$c/baseline_inject.so" "$f" trace -o "$2" --)
      return ;;
    deferred) # CUPTI's records converted on the writer thread, outside CUPTI's callback
      pre=(env FERRY_TRACE_DEFER_CONVERSION=1 "$f" trace -o "$2" --)
      return ;;
    plain|kineto) pre=(); return ;;
    kinetosync) pre=(env FERRY_KINETO_SYNC=1); return ;;
    *) die "trace-inject: unknown variant '$1' (traced lite nosync allcalls nopy noblock slowflush base deferred kineto kinetosync)" ;;
  esac
  pre=("$f" trace ${flags[@]+"${flags[@]}"} -o "$2" --)
}

cmd_trace_inject() {
  local what=${1:-smoke} out f status=0 r lvl final
  case $what in smoke|findings|cost|api) ;; *) die "trace-inject: unknown mode '$what' (smoke findings cost api)" ;; esac
  # SMOKE_PARTS: which of bench (ferry's egress and ingest L1, against the in-process recorder), kineto
  # (torch.profiler inside a recorded program), seg and train (the PyTorch examples) run; all by default.
  # Checked before anything is made.
  local parts=" ${SMOKE_PARTS:-bench kineto seg train} " part words
  read -ra words <<< "$parts"
  for part in "${words[@]}"; do
    [ "$what" = smoke ] || break
    case $part in bench|kineto|seg|train) ;; *) die "trace-inject smoke: unknown part '$part' in SMOKE_PARTS (bench kineto seg train, separated by spaces)" ;; esac
  done
  read -ra words <<< "${TRACE_VARIANTS:-}"
  for part in "${words[@]}"; do
    [ "$what" = api ] && [ "$part" = kinetosync ] && die "trace-inject api: variant kinetosync is for cost runs (api_cost.py has only --kineto cuda)"
  done
  # Everything under a work folder; $OUT gets the tarball and the summary only (few files come back).
  final=${OUT:-/tmp/ferry-out}
  out=$(mktemp -d /tmp/trace-inject.XXXX)
  mkdir -p "$final"
  nvidia_libs
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  export FERRY_TRACE_SITE="$PWD/python/ferry/_trace_site" FERRY_LIBRARY="$PWD/$c/libferry_c.so"
  f="$PWD/$c/ferry"
  echo "date: $(date -u +%FT%TZ)  commit: $(cat "$c/commit" 2>/dev/null)" | tee "$out/run.txt"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$out/run.txt"
  if [ "$what" = smoke ]; then
    for bench in egress ingest; do
      [[ $parts == *" bench "* ]] || break
      "$f" bench $bench --backend cuda --levels L1 --steps 20 --trace "$out/inproc/$bench.json" \
        > "$out/inproc-$bench.txt" 2>&1 || status=1
      "$f" trace -o "$out/$bench" -- "$f" bench $bench --backend cuda --levels L1 --steps 20 \
        > "$out/traced-$bench.txt" 2>&1 || status=1
      "$f" analyze "$out/$bench" > "$out/$bench-analysis.txt" 2>&1 || status=1
      "$f" analyze "$out/inproc/$bench.L1.json" > "$out/inproc-$bench-analysis.txt" 2>&1 || status=1
      echo "== $bench L1" | tee -a "$out/summary.txt"
      python3 scripts/trace_parity.py "$out/inproc/$bench.L1.json" "$out/$bench" 2>&1 | tee -a "$out/summary.txt" || status=1
      grep -m1 -A1 "^Findings\|^  1\." "$out/$bench-analysis.txt" "$out/inproc-$bench-analysis.txt" | tee -a "$out/summary.txt"
    done
    if [[ $parts == *" kineto "* ]]; then
      "$f" trace -o "$out/kineto" -- python3 tests/inject/kineto_inside.py > "$out/kineto.txt" 2>&1 || status=1
      "$f" analyze "$out/kineto" > "$out/kineto-analysis.txt" 2>&1
      # The script's own line (the profiler's CUDA events; it exits 1 when there are none) and the notes.
      { echo "== torch.profiler inside"; grep "torch.profiler CUDA events" "$out/kineto.txt"; tail -3 "$out/kineto.txt"
        grep -i "note" "$out/kineto-analysis.txt"; } | tee -a "$out/summary.txt"
    fi
    if [[ $parts == *" seg "* ]]; then
      "$f" trace -o "$out/seg" -- python3 examples/pytorch/segmentation_egress.py --levels ${SEG_LEVEL:-L1} --steps 8 \
        > "$out/seg.txt" 2>&1 || status=1
      "$f" analyze "$out/seg" > "$out/seg-analysis.txt" 2>&1 || status=1
    fi
    if [[ $parts == *" train "* ]]; then
      "$f" trace -o "$out/train" -- python3 examples/pytorch/train_prefetch.py --levels ${TRAIN_LEVEL:-loader} --steps 20 \
        > "$out/train.txt" 2>&1 || status=1
      "$f" analyze "$out/train" > "$out/train-analysis.txt" 2>&1 || status=1
    fi
    for x in seg train; do
      [[ $parts == *" $x "* ]] || continue
      { echo "== $x"; tail -2 "$out/$x.txt"; sed -n '1,12p' "$out/$x-analysis.txt"; grep -m3 -A2 "^Findings" "$out/$x-analysis.txt"; } | tee -a "$out/summary.txt"
    done
  elif [ "$what" = findings ]; then
    # Each reference level of the PyTorch examples recorded unmodified, one level per recording.
    for lvl in ${SEG_LEVELS:-L0 L1 L2 L3 L4 L4-pinned ferry}; do
      "$f" trace -o "$out/seg-$lvl" -- python3 examples/pytorch/segmentation_egress.py --levels "$lvl" --steps 6 \
        > "$out/seg-$lvl.txt" 2>&1 || status=1
      "$f" analyze "$out/seg-$lvl" > "$out/seg-$lvl-analysis.txt" 2>&1 || status=1
      echo "seg $lvl: $(grep -m1 -A0 '^  1\. ' "$out/seg-$lvl-analysis.txt")" | tee -a "$out/summary.txt"
      rm -f "$out/seg-$lvl"/*.ferry-proc
    done
    for lvl in ${TRAIN_LEVELS:-loader pinned reference ferry}; do
      "$f" trace -o "$out/train-$lvl" -- python3 examples/pytorch/train_prefetch.py --levels "$lvl" --steps 20 \
        > "$out/train-$lvl.txt" 2>&1 || status=1
      "$f" analyze "$out/train-$lvl" > "$out/train-$lvl-analysis.txt" 2>&1 || status=1
      echo "train $lvl: $(grep -m1 -A0 '^  1\. ' "$out/train-$lvl-analysis.txt")" | tee -a "$out/summary.txt"
      rm -f "$out/train-$lvl"/*.ferry-proc
    done
  elif [ "$what" = api ]; then
    # api: what one CUDA call costs the calling thread (tests/inject/api_cost.py), plain and under each
    # variant of TRACE_VARIANTS, interleaved (ABBA), TRACE_RUNS times.
    local order v
    for r in $(seq 1 "${TRACE_RUNS:-4}"); do
      # shellcheck disable=SC2086  # one word per variant
      order=$(printf '%s\n' plain ${TRACE_VARIANTS:-traced nosync lite kineto})
      [ $((r % 2)) = 0 ] && order=$(printf '%s\n' "$order" | tac)
      for v in $order; do
        local pre=() args=(--json "$out/cost-$v-$r.json")
        set_trace_prefix "$v" "$out/trace-$v-$r"
        [ "$v" = kineto ] && args+=(--kineto cuda)
        ${pre[@]+"${pre[@]}"} python3 tests/inject/api_cost.py "${args[@]}" > "$out/cost-$v-$r.txt" 2>&1 || status=1
        rm -rf "$out/trace-$v-$r"
      done
    done
    python3 scripts/trace_cost.py "$out" | tee -a "$out/summary.txt"
  else
    # cost: TRACE_EXAMPLE (examples/pytorch/, or tests/inject/mlp_launch_bound.py with TRACE_SCRIPT) run plain
    # and under each variant of TRACE_VARIANTS (traced: the defaults; lite; nosync: --no-syncs; allcalls:
    # --all-runtime-calls; nopy: --python none; noblock: no blocking calls; slowflush: --flush-ms 1000;
    # kineto: the script under torch.profiler's CUDA activities, PyTorch's own recorder; kinetosync: the same
    # with its synchronization records, as `ferry trace` records them by default), interleaved,
    # TRACE_RUNS times (6: as many rounds in each order; TRACE_ANALYZE=0 skips the first round's analyses,
    # tens of seconds each); with
    # TRACE_RANKS=N through torch.distributed.run on N GPUs (its results.json).
    local script=${TRACE_SCRIPT:-examples/pytorch/${TRACE_EXAMPLE:-train_prefetch.py}} v launch
    launch=(python3)
    [ -n "${TRACE_RANKS:-}" ] && launch=(python3 -m torch.distributed.run --standalone --nproc_per_node "$TRACE_RANKS")
    local order
    for r in $(seq 1 "${TRACE_RUNS:-6}"); do
      # Alternate rounds run the variants in reverse (ABBA): a machine that drifts over the call (its CPUs
      # slowing as it warms) then weighs on every variant alike, not on whichever always runs second.
      # shellcheck disable=SC2086  # one word per variant
      order=$(printf '%s\n' plain ${TRACE_VARIANTS:-traced})
      [ $((r % 2)) = 0 ] && order=$(printf '%s\n' "$order" | tac)
      for v in $order; do
        local args=(${TRACE_ARGS:---levels ideal,ferry --steps 40}) pre=()
        if [ -n "${TRACE_RANKS:-}" ]; then args+=(--out "$out/run-$v-$r"); else args+=(--json "$out/cost-$v-$r.json"); fi
        set_trace_prefix "$v" "$out/trace-$v-$r"
        local run=("$script")
        # torch.profiler inside: the MLP's own option, else (and always with syncs) a wrapper around the script
        if [ "$v" = kineto ] && [ "$(basename "$script")" = mlp_launch_bound.py ]; then args+=(--kineto cuda)
        elif [ "$v" = kineto ] || [ "$v" = kinetosync ]; then run=(tests/inject/under_kineto.py "$script"); fi
        ${pre[@]+"${pre[@]}"} "${launch[@]}" "${run[@]}" "${args[@]}" > "$out/cost-$v-$r.txt" 2>&1 || status=1
        [ -n "${TRACE_RANKS:-}" ] && cp "$out/run-$v-$r/results.json" "$out/cost-$v-$r.json" 2>/dev/null
        if [ "$r" = 1 ] && [ -d "$out/trace-$v-$r" ] && [ "${TRACE_ANALYZE:-1}" != 0 ]; then
          "$f" analyze "$out/trace-$v-$r" > "$out/analysis-$v.txt" 2>&1 || status=1
          tail -n 3 "$out/cost-$v-$r.txt" | grep "ferry trace" | tee -a "$out/summary.txt"
          grep -A12 "^Per rank\|^Straggler" "$out/analysis-$v.txt" | tee -a "$out/summary.txt"
          # The CUDA calls recorded per thread and step: what the variant instrumented.
          if [ "$v" != lite ] && [ "$v" != kineto ] && [ "$v" != plain ]; then
            python3 scripts/trace_calls.py "$out/trace-$v-$r" --top 6 > "$out/calls-$v.txt" 2>&1 || true
            sed "s/^/$v: /" "$out/calls-$v.txt" | tee -a "$out/summary.txt"
          fi
        fi
        [ "$r" = 1 ] || rm -rf "$out/trace-$v-$r"
      done
    done
  fi
  [ "$what" = findings ] && what=findings
  if [ "$what" = cost ]; then
    what="cost-$(basename "${TRACE_SCRIPT:-${TRACE_EXAMPLE:-train_prefetch.py}}" .py)${TRACE_RANKS:+-x$TRACE_RANKS}"
    python3 scripts/trace_cost.py "$out" | tee -a "$out/summary.txt"
  fi
  # The recordings of cost runs (tens of MB) stay behind: their analyses are in the tarball.
  [ "$what" = smoke ] || [ "$what" = findings ] || find "$out" \( -name 'trace.json' -o -name '*.ferry-proc' \) -delete
  tar czf "$final/trace-inject-$what.tgz" -C "$out" . 2>/dev/null
  cp "$out/summary.txt" "$final/summary-$what.txt" 2>/dev/null
  echo "trace-inject $what: exit $status"
  return $status
}

# -------------------------------------------------------------------------------------------- vit-ddp
# On a machine of 2 GPUs (FERRY_GPUS, default 2): examples/pytorch/vit_ddp.py, a real ViT-L/32 trained data
# parallel by PyTorch's DDP at its usual settings beside ferry.torch.DataParallel, one process per GPU
# (torch.distributed.run), each run into its own folder of $OUT (default /tmp/ferry-out):
#   nvlink/       every level (VIT_LEVELS, default all) over the GPUs' own link; VIT_PROFILE (default
#                 ferry; `none` for no trace) is also traced for 5 steps per rank into nvlink/traces.tgz
#   p2p_off/      the same levels with NCCL_P2P_DISABLE=1 (through host memory, a PCIe-like link)
#   convergence/  VIT_CONV_STEPS (300) steps of ddp, ddp_bf16, ferry and ferry_lossy on VIT_CONV_MODEL
#                 (vit_b_32; tiny for a quick one): rank 0's loss per step, each curve against DDP's
# Each folder holds results.json and run.log; summary.txt (the machine and every run's table) is printed
# last. ferry's levels need python/ and libferry_c.so (FERRY_LIBRARY, or .carry/libferry_c.so when
# carried); without them they are reported as skipped. VIT_ARGS: more arguments for every run (--amp, ...).
# Argument: all (default), nvlink, p2p_off or convergence (all: about 5 minutes on 2x H100, an estimate).
cmd_vit_ddp() {
  local what=${1:-all} out gpus levels profile name status=0
  case "$what" in all | nvlink | p2p_off | convergence) ;;
    *) die "vit-ddp: expected all, nvlink, p2p_off or convergence, not '$what'" ;;
  esac
  out=${OUT:-/tmp/ferry-out}
  gpus=${FERRY_GPUS:-2}
  levels=${VIT_LEVELS:-all}
  profile=${VIT_PROFILE:-ferry}
  mkdir -p "$out"
  nvidia_libs
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  [ -z "${FERRY_LIBRARY:-}" ] && [ -f "$c/libferry_c.so" ] && export FERRY_LIBRARY="$PWD/$c/libferry_c.so"
  {
    echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(git describe --always --dirty 2>/dev/null || cat "$c/commit" 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvidia-smi topo -m 2>&1 | head -n $((gpus + 1))
    python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__,
      "NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
  } 2>&1 | tee "$out/machine.txt"

  # vit_run NAME ENV... -- ARGS...: one torch.distributed.run of the example into $out/NAME.
  vit_run() {
    local name=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    mkdir -p "$out/$name"
    echo "=== vit-ddp $name ${envs[*]}"
    # shellcheck disable=SC2086  # VIT_ARGS: one word per argument
    env "${envs[@]}" python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus" \
      examples/pytorch/vit_ddp.py --out "$out/$name" "$@" ${VIT_ARGS:-} 2>&1 | tee "$out/$name/run.log"
    rc[vit_$name]=${PIPESTATUS[0]}
    [ "${rc[vit_$name]}" = 0 ] || status=1
  }
  if [ "$what" = all ] || [ "$what" = nvlink ]; then
    if [ "$profile" = none ]; then
      vit_run nvlink NCCL_P2P_DISABLE=0 -- --levels "$levels"
    else
      vit_run nvlink NCCL_P2P_DISABLE=0 -- --levels "$levels" --profile "$profile"
      # The device tool brings back 8 files: the per-rank traces travel as one archive.
      if compgen -G "$out/nvlink/trace_*.json" >/dev/null; then
        (cd "$out/nvlink" && tar -czf traces.tgz trace_*.json && rm -f trace_*.json && ls -la traces.tgz)
      fi
    fi
  fi
  if [ "$what" = all ] || [ "$what" = p2p_off ]; then
    vit_run p2p_off NCCL_P2P_DISABLE=1 -- --levels "$levels"
  fi
  if [ "$what" = all ] || [ "$what" = convergence ]; then
    vit_run convergence NCCL_P2P_DISABLE=0 -- --convergence "${VIT_CONV_STEPS:-300}" \
      --model "${VIT_CONV_MODEL:-vit_b_32}" --levels "${VIT_CONV_LEVELS:-ddp,ddp_bf16,ferry,ferry_lossy}"
  fi

  echo "=== summary"
  {
    cat "$out/machine.txt"
    print_rcs
    python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(out, name, "results.json")) as f:
            return json.load(f)
    except Exception as e:  # noqa: BLE001 - the table says what is missing
        print(f"{name}/results.json unreadable: {e}")
        return None


def cell(r, key, spec):
    return format(r[key], spec) if r and r.get(key) is not None else "-"


runs = {name: load(name) for name in ("nvlink", "p2p_off") if os.path.isdir(os.path.join(out, name))}
runs = {k: {r["level"]: r for r in v["levels"]} for k, v in runs.items() if v}
if runs:
    print("steps/s (x single, x best DDP) per link; best DDP marked *")
    print(f"  {'level':<13}" + "".join(f"  {k:>26}" for k in runs))
    for level in next(iter(runs.values())):
        cells = []
        for rows in runs.values():
            r = rows.get(level)
            if not r or r["status"] != "ok":
                cells.append((r["status"] if r else "-")[:26])
            else:
                best = "*" if r.get("x_best_ddp") == 1.0 and level.startswith("ddp") else " "
                cells.append(f"{r['steps_per_s']:7.3f} ({cell(r, 'x_single', '.3f')}, {cell(r, 'x_best_ddp', '.3f')}){best}")
        print(f"  {level:<13}" + "".join(f"  {c:>26}" for c in cells))
    for link, rows in runs.items():
        for level, r in rows.items():
            if r["status"] != "ok":
                print(f"  {link} {level}: {r['status']}: {r.get('skipped') or r.get('error')}")
            elif r.get("ferry_stats"):
                s = r["ferry_stats"]
                mib = ", ".join(f"{b / 2**20:.1f}" for b in (s.get("plan") or {}).get("bucket_bytes") or [])
                print(f"  {link} {level}: buckets (MiB) [{mib}], codecs {s.get('codecs')}, learning {s.get('learning')}, "
                      f"decided {json.dumps(s.get('decided'))[:300]}" + (f"; {r['note']}" if r.get("note") else ""))
conv = load("convergence") if os.path.isdir(os.path.join(out, "convergence")) else None
if conv:
    print(f"convergence: {conv['config']['model']}, {conv['config']['convergence']} steps; "
          f"largest relative loss difference to {conv['reference']} at any step")
    for r in conv["levels"]:
        if r["status"] == "ok":
            print(f"  {r['level']:<13} final loss {r['final_loss']:.4f}  max rel diff {r['max_rel_diff']:.3e} "
                  f"(step {r['max_rel_diff_step']})")
        else:
            print(f"  {r['level']:<13} {r['status']}: {r.get('skipped') or r.get('error')}")
PY
  } > "$out/summary.txt" 2>&1
  rm -f "$out/machine.txt"  # it heads summary.txt: one file fewer for the device tool to bring back
  cat "$out/summary.txt"
  return $status
}

# -------------------------------------------------------------------------------------------------- dp
# ferry.torch.DataParallel and the comm path on the GPUs, in stages that each fit one 10-minute call; each
# packs its raw output into $OUT/STAGE.tgz (the device tool brings back 8 files) and prints a summary.
#   a  2 GPUs: a tiny ViT (single, DDP's best, ferry, ferry lossy; the rest is skipped when it fails), then
#      ViT-L/32, every level, over NVLink (ferry traced per rank)
#   b  2 GPUs: ViT-L/32 with NCCL_P2P_DISABLE=1, the convergence guard (vit_b_32, 300 steps), and world
#      size 1 on one GPU (ferry's local cost against plain training)
#   c  1 GPU: the wrappers' local cost (scripts/dp_local_cost.py); 2 GPUs: the multigpu and comm tests,
#      bench allreduce 8 B .. 1 GiB beside nccl-tests (one process, mpirun)
#   d  4 GPUs: ViT-L/32 scaling (single, DDP's best, ferry, ferry lossy) over NVLink and with P2P off,
#      allreduce beside nccl-tests
#   e  a rerun after a change: the local cost (1 GPU), then ViT-L/32 over NVLink on 2 GPUs, four levels
#   f  at the final main: the gpu suites (python_cuda alone took 284 s on 2 H100s, 2026-11-27) and the comm
#      tests (2 GPUs)
#   g  2 GPUs: where the small all-reduce's time goes (dp_floor: nccl-tests and bench allreduce 8 B .. 64 MiB,
#      ferry with blocking and nonblocking communicators), ViT-L/32 trained in bf16 (single, DDP's best,
#      ferry in bf16 and in f32), and torch.profiler traces of DDP's best, DDP bf16 and ferry, each read by
#      ferry analyze
#   h  2 GPUs, after a change of the comm path: the all-reduce's floor (as g), the multigpu and comm tests,
#      ViT-L/32 over NVLink (four levels)
cmd_dp() {
  local stage=${1:?dp: expected a, b, c, d, e, f, g or h} final work
  final=${OUT:-/tmp/ferry-out}
  work=/tmp/dp-$stage
  rm -rf "$work" && mkdir -p "$work" "$final"
  nvidia_libs
  export PYTHONUNBUFFERED=1
  local gpus2=0,1
  case "$stage" in
    a)  # smoke, then ViT-L/32 over NVLink
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work/smoke VIT_PROFILE=none VIT_LEVELS=single,ddp100_view,ferry,ferry_lossy \
        VIT_ARGS="--model tiny --steps 10 --warmup 15" timeout 150 "$0" vit-ddp nvlink > "$work/smoke.log" 2>&1
      rc[smoke]=$?
      tail -n 12 "$work/smoke.log"
      if [ "${rc[smoke]}" = 0 ]; then
        CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work timeout 330 "$0" vit-ddp nvlink > "$work/nvlink.log" 2>&1
        rc[nvlink]=$?
        tail -n 16 "$work/nvlink.log"
      fi
      ;;
    b)  # ViT-L/32 with NCCL_P2P_DISABLE=1, the convergence guard, world size 1
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work VIT_PROFILE=none timeout 240 "$0" vit-ddp p2p_off > "$work/p2p_off.log" 2>&1
      rc[p2p_off]=$?
      tail -n 16 "$work/p2p_off.log"
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work VIT_CONV_LEVELS=ddp,ferry,ferry_lossy timeout 150 "$0" vit-ddp convergence \
        > "$work/convergence.log" 2>&1
      rc[convergence]=$?
      tail -n 8 "$work/convergence.log"
      mkdir -p "$work/world1"
      CUDA_VISIBLE_DEVICES=0 FERRY_LIBRARY="$PWD/$c/libferry_c.so" PYTHONPATH="$PWD/python" timeout 120 \
        python3 examples/pytorch/vit_ddp.py --levels single,ddp100_view,ferry --out "$work/world1" \
        > "$work/world1/run.log" 2>&1
      rc[world1]=$?
      tail -n 6 "$work/world1/run.log"
      ;;
    c)  # ferry's local cost at world size 1, the multigpu and comm tests, the all-reduce beside nccl-tests
      CUDA_VISIBLE_DEVICES=0 FERRY_LIBRARY="$PWD/$c/libferry_c.so" PYTHONPATH="$PWD/python" timeout 150 \
        python3 "$here/dp_local_cost.py" --out "$work/local_cost.json" > "$work/local_cost.log" 2>&1
      rc[local_cost]=$?
      tail -n 8 "$work/local_cost.log"
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work/tests timeout 240 "$0" comm-tests > "$work/comm_tests.log" 2>&1
      rc[comm_tests]=$?
      tail -n 14 "$work/comm_tests.log"
      CUDA_VISIBLE_DEVICES=$gpus2 dp_latency 2 "$work" 60
      ;;
    e)  # a rerun after a change: the local cost at world size 1, then ViT-L/32 on 2 GPUs (four levels)
      CUDA_VISIBLE_DEVICES=0 FERRY_LIBRARY="$PWD/$c/libferry_c.so" PYTHONPATH="$PWD/python" timeout 120 \
        python3 "$here/dp_local_cost.py" --out "$work/local_cost.json" > "$work/local_cost.log" 2>&1
      rc[local_cost]=$?
      tail -n 8 "$work/local_cost.log"
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work VIT_PROFILE=none VIT_LEVELS=single,ddp100_view,ferry,ferry_lossy \
        timeout 150 "$0" vit-ddp nvlink > "$work/nvlink.log" 2>&1
      rc[nvlink]=$?
      tail -n 8 "$work/nvlink.log"
      ;;
    f)  # at the final main: the gpu suites and the comm tests (ViT-L/32 is stage h's)
      OUT=$work/gpu timeout 420 "$0" tests gpu > "$work/tests_gpu.log" 2>&1
      rc[tests_gpu]=$?
      grep -E "tests passed|tests failed|Failed|Not Run" "$work/tests_gpu.log" | tail -n 5
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work/tests timeout 160 "$0" comm-tests > "$work/comm_tests.log" 2>&1
      rc[comm_tests]=$?
      grep -E "^rc |: rc " "$work/comm_tests.log"
      ;;
    d)  # 4 GPUs: ViT-L/32 scaling and the all-reduce beside nccl-tests
      OUT=$work FERRY_GPUS=4 VIT_PROFILE=none VIT_LEVELS=single,ddp100_view,ferry,ferry_lossy timeout 240 \
        "$0" vit-ddp nvlink > "$work/vit4.log" 2>&1
      rc[vit4]=$?
      tail -n 12 "$work/vit4.log"
      mkdir -p "$work/four"
      OUT=$work/four FERRY_GPUS=4 VIT_PROFILE=none VIT_LEVELS=single,ddp100_view,ferry,ferry_lossy timeout 180 \
        "$0" vit-ddp p2p_off > "$work/p2p_off4.log" 2>&1
      rc[p2p_off4]=$?
      tail -n 8 "$work/p2p_off4.log" | grep -v "^  p2p_off ferry"
      dp_latency 4 "$work" 45
      ;;
    g)  # the per-call floor, pure bf16, the analyzer on DDP's and ferry's traces
      dp_floor "$work"
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work/bf16 VIT_PROFILE=none VIT_LEVELS=single,ddp100_view,ferry,ferry_f32 \
        VIT_ARGS="--param-dtype bfloat16" timeout 150 "$0" vit-ddp nvlink > "$work/bf16.log" 2>&1
      rc[bf16]=$?
      tail -n 9 "$work/bf16.log" | grep -v "^  nvlink ferry"
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work/profiles VIT_PROFILE=ddp100_view,ddp_bf16,ferry \
        VIT_LEVELS=ddp100_view,ddp_bf16,ferry VIT_ARGS="--steps 10" timeout 180 "$0" vit-ddp nvlink \
        > "$work/profiles.log" 2>&1
      rc[profiles]=$?
      mkdir -p "$work/analyze"
      tar -xzf "$work/profiles/nvlink/traces.tgz" -C "$work/analyze" 2>/dev/null
      for t in "$work"/analyze/trace_*_rank0.json; do
        [ -f "$t" ] || continue
        "$c/ferry" analyze "$t" > "${t%.json}.txt" 2>&1
        echo "--- $(basename "$t")"
        head -n 14 "${t%.json}.txt"
      done
      rm -f "$work"/analyze/trace_*.json
      ;;
    h)  # after a comm change: the floor, the multigpu and comm tests, ViT-L/32 over NVLink (four levels)
      dp_floor "$work"
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work/tests timeout 240 "$0" comm-tests > "$work/comm_tests.log" 2>&1
      rc[comm_tests]=$?
      grep -E "^rc |: rc " "$work/comm_tests.log"
      CUDA_VISIBLE_DEVICES=$gpus2 OUT=$work VIT_PROFILE=none VIT_LEVELS=single,ddp100_view,ferry,ferry_lossy \
        timeout 170 "$0" vit-ddp nvlink > "$work/nvlink.log" 2>&1
      rc[nvlink]=$?
      tail -n 8 "$work/nvlink.log" | grep -v "^  nvlink ferry"
      ;;
    *) die "dp: expected a, b, c, d, e, f, g or h, not '$stage'" ;;
  esac
  echo "=== dp $stage: $(date -u +%FT%TZ)"
  print_rcs
  tar -czf "$final/$stage.tgz" -C "$work" .
}

# dp_latency GPUS DIR SECONDS: bench allreduce 8 B .. 1 GiB beside nccl-tests' all_reduce_perf, in one
# process and over mpirun (one process per GPU), fp32, NVLink.
# dp_floor DIR: the small and middle all-reduces on 2 GPUs, 8 B .. 64 MiB: nccl-tests (sum and avg; one
# process and mpirun) beside ferry's bench with its blocking communicators and with FERRY_NCCL_NONBLOCKING=1
# (NCCL then starts a thread to enqueue every collective), in one process and over mpirun.
dp_floor() {
  local dir=$1 op mode
  local sizes=(-b 8 -e 64M -f 4)
  if [ -x "$c/all_reduce_perf" ]; then
    for op in sum avg; do
      CUDA_VISIBLE_DEVICES=0,1 timeout 60 "$c/all_reduce_perf" "${sizes[@]}" -g 2 -n 200 -w 20 -c 0 -o "$op" \
        > "$dir/nccl_tests_$op.txt" 2>&1
      rc[nccl_$op]=$?
    done
    CUDA_VISIBLE_DEVICES=0,1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 mpirun -n 2 \
      -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$c/all_reduce_perf" "${sizes[@]}" -g 1 -n 200 -w 20 -c 0 \
      > "$dir/nccl_tests_mpi.txt" 2>&1
    rc[nccl_mpi]=$?
  fi
  for mode in blocking nonblocking; do
    local nb=0
    [ "$mode" = nonblocking ] && nb=1
    CUDA_VISIBLE_DEVICES=0,1 FERRY_NCCL_NONBLOCKING=$nb timeout 90 "$c/ferry" bench allreduce --backend cuda \
      --gpus 2 "${sizes[@]}" -n 200 -w 20 --codec fp32 --json > "$dir/ferry_$mode.json" 2> "$dir/ferry_$mode.err"
    rc[ferry_$mode]=$?
    CUDA_VISIBLE_DEVICES=0,1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 90 mpirun -n 2 \
      -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x FERRY_NCCL_NONBLOCKING=$nb "$c/ferry" bench allreduce \
      --bootstrap mpi "${sizes[@]}" -n 200 -w 20 --codec fp32 --json > "$dir/ferry_mpi_$mode.json" \
      2> "$dir/ferry_mpi_$mode.err"
    rc[ferry_mpi_$mode]=$?
  done
  python3 "$here/allreduce_tables.py" floor "$dir"
}

dp_latency() {
  local n=$1 dir=$2 limit=$3
  timeout "$limit" "$c/ferry" bench allreduce --backend cuda --gpus "$n" -b 8 -e 1G -f 4 -n 50 -w 10 --codec fp32 \
    --json > "$dir/allreduce_$n.json" 2> "$dir/allreduce_$n.err"
  rc[allreduce_$n]=$?
  if [ -x "$c/all_reduce_perf" ]; then
    timeout "$limit" "$c/all_reduce_perf" -b 8 -e 1G -f 4 -g "$n" -n 50 -w 10 -c 1 > "$dir/nccl_tests_$n.txt" 2>&1
    rc[nccl_tests_$n]=$?
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$limit" mpirun -n "$n" -x LD_LIBRARY_PATH \
      -x NCCL_NVLS_ENABLE "$c/all_reduce_perf" -b 8 -e 1G -f 4 -g 1 -n 50 -w 10 -c 1 > "$dir/nccl_tests_mpi_$n.txt" 2>&1
    rc[nccl_tests_mpi_$n]=$?
  fi
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$limit" mpirun -n "$n" -x LD_LIBRARY_PATH \
    -x NCCL_NVLS_ENABLE "$c/ferry" bench allreduce --bootstrap mpi -b 8 -e 1G -f 4 -n 50 -w 10 --codec fp32 --json \
    > "$dir/allreduce_mpi_$n.json" 2> "$dir/allreduce_mpi_$n.err"
  rc[allreduce_mpi_$n]=$?
  python3 "$here/allreduce_tables.py" latency "$dir" "$n"
}

sub=${1:-help}
shift || true
case "$sub" in
  carry) cmd_carry "$@" ;;
  tests) cmd_tests "$@" ;;
  comm-tests) cmd_comm_tests "$@" ;;
  check) cmd_check "$@" ;;
  verify) cmd_verify "$@" ;;
  trace-check) cmd_trace_check "$@" ;;
  trace-inject) cmd_trace_inject "$@" ;;
  comm) cmd_comm "$@" ;;
  one-gpu-comm) cmd_one_gpu_comm "$@" ;;
  examples) cmd_examples "$@" ;;
  loader) cmd_loader "$@" ;;
  vit-ddp) cmd_vit_ddp "$@" ;;
  dp) cmd_dp "$@" ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    die "unknown subcommand '$sub'"
    ;;
esac
