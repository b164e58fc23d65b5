#!/usr/bin/env bash
# Every test that can run on this machine: installs dependencies, builds, runs the cpu-labelled tests
# (the layering check, the compile-fail tests and the Python package's pytest suite among them), installs
# the Python package with pip, lints (clang-format, clang-tidy), fuzzes
# the trace importers for a minute and the analyzer on what they accept for 30 s, smoke-tests bench --trace
# and analyze, then runs the cpu tests again
# under ThreadSanitizer and under AddressSanitizer+UBSan, checks a downstream find_package build,
# and runs the gpu-labelled tests only when a GPU is visible (reporting them as not run otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${FERRY_JOBS:-$(nproc)}
export CTEST_PARALLEL_LEVEL=$jobs

# Each step says when it started and how long the run has taken so far (CI's time is budgeted).
step() { printf '\n=== [%s, +%dm%02ds] %s\n' "$(date -u +%T)" $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

step "build (default preset)"
scripts/build.sh default

step "cpu tests"
ctest --preset cpu -j "$jobs"

step "Python package: pip install of ferry-gpu in a venv of Debian's /usr/bin/python3; the ferry command"
# (The package's tests ran above from the source tree: ctest 'python', /usr/bin/python3 -m pytest tests/python.)
# The prebuilt library and CLI of the default build go into the package, as setup.py's CMake build would.
venv=$(mktemp -d)
/usr/bin/python3 -m venv --system-site-packages "$venv"
FERRY_PREBUILT_LIBRARY="$PWD/build/default/src/c/libferry_c.so" \
  FERRY_PREBUILT_CLI="$PWD/build/default/tools/ferry/ferry" \
  "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps --no-cache-dir .
(
  cd "$venv"
  unset PYTHONPATH FERRY_LIBRARY FERRY_CLI
  # One version: pip's metadata, ferry.__version__, and the installed `ferry` command's.
  pip_version=$("$venv/bin/python" -m pip show ferry-gpu | sed -n 's/^Version: //p')
  py_version=$("$venv/bin/python" -c 'import ferry; print(ferry.__version__)')
  cli_version=$("$venv/bin/ferry" --version)
  echo "pip show ferry-gpu: $pip_version; ferry.__version__: $py_version; ferry --version: $cli_version"
  case "$cli_version" in  # the CLI's may add the commit it was built from: 0.1.0+g1a2b3c4
    "ferry $pip_version" | "ferry $pip_version+"*) [ "$pip_version" = "$py_version" ] ;;
    *) false ;;
  esac
  "$venv/bin/python" -m ferry probe --backend host --bytes 1MiB --iterations 1 >/dev/null
  FERRY_EXPECT_INSTALLED=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    "$OLDPWD/tests/python/test_library.py" "$OLDPWD/tests/python/test_header.py" \
    "$OLDPWD/tests/python/test_package.py" "$OLDPWD/tests/python/test_analyze_schema.py"
)
rm -rf "$venv"

step "lint: clang-format and clang-tidy (.clang-format, .clang-tidy; layering is the ctest 'layers')"
scripts/lint.sh

step "ferry probe on the emulated device (smoke)"
build/default/tools/ferry/ferry probe --backend host --bytes 4MiB --iterations 2 --pin-bytes 1MiB --json >/dev/null

step "the emulated device as a laptop user has it: non-root, RLIMIT_MEMLOCK of 8 MiB (bench egress, Python Egress and Prefetcher)"
# The emulator falls back to unlocked memory past RLIMIT_MEMLOCK, with one note on stderr. Root would not
# show it (CAP_IPC_LOCK lifts the limit), so this runs as nobody, from a world-readable copy of what it
# needs: a checkout under /root, or mktemp's 0700 directories, are closed to that user.
as_user=$(mktemp -d)
as_user_log=$(mktemp)
mkdir "$as_user/bin" "$as_user/python"
cp build/default/tools/ferry/ferry build/default/src/c/libferry_c.so "$as_user/bin/"
cp -r python/ferry "$as_user/python/"
cp CMakeLists.txt "$as_user/"  # laid out as a source checkout, where the package reads its version there
find "$as_user" -name __pycache__ -prune -exec rm -rf {} +
chmod -R a+rX "$as_user"
# As root: the limit an unprivileged user gets by default, then nobody. Not root: this user and its own
# limit (which an unprivileged process could not raise to 8 MiB if its hard limit is lower).
as_root=0
[ "$(id -u)" = 0 ] && as_root=1
as_user_prefix=()
[ $as_root = 1 ] && as_user_prefix=(prlimit --memlock=8388608:8388608 setpriv --reuid=65534 --regid=65534 --clear-groups)
as_user_run() {
  (cd "$as_user" && ${as_user_prefix[@]+"${as_user_prefix[@]}"} \
    env HOME="$as_user" PYTHONDONTWRITEBYTECODE=1 FERRY_LIBRARY="$as_user/bin/libferry_c.so" PYTHONPATH="$as_user/python" "$@")
}
if ! as_user_run bin/ferry bench egress --backend host --shape 2x3x64x64 --steps 2 --warmup 1 --compute-ms 1 \
    >/dev/null 2>"$as_user_log" ||
  ! as_user_run /usr/bin/python3 - >/dev/null 2>>"$as_user_log" <<'PY'
import torch
import ferry
from ferry.torch import Egress, NullSink, Prefetcher
dev = ferry.Device("host")
with Egress(NullSink(), device=dev) as e:  # the default pool: 8 slots of 64 MiB
    for _ in range(3):
        e.submit(torch.ones(1 << 20))
batches = [torch.full((1024, 1024), float(i)) for i in range(4)]  # 4 MiB each
assert [float(b[0, 0]) for b in Prefetcher(batches, device=dev)] == [0.0, 1.0, 2.0, 3.0]
PY
then
  cat "$as_user_log"
  exit 1
fi
# Both went past the limit, and each said so once (as root, where the limit is the one set above).
[ $as_root = 0 ] || [ "$(grep -c '^ferry: note: the emulated device uses unlocked memory' "$as_user_log")" = 2 ] || {
  cat "$as_user_log"
  exit 1
}
rm -rf "$as_user" "$as_user_log"

step "downstream find_package(ferry) build"
cmake --install build/default --prefix build/install >/dev/null
cmake -S examples/downstream -B build/downstream -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/downstream -j "$jobs"
build/downstream/ferry_downstream

step "fuzz the trace importers (libFuzzer, ${FERRY_FUZZ_SECONDS:=60} s over tests/fuzz/corpus)"
scripts/fuzz.sh import "$FERRY_FUZZ_SECONDS"

step "fuzz the analyzer on what the importers accept (libFuzzer, ${FERRY_FUZZ_ANALYZE_SECONDS:=30} s)"
scripts/fuzz.sh analyze "$FERRY_FUZZ_ANALYZE_SECONDS"

step "ferry bench --trace and ferry analyze on the emulated device (smoke)"
trace_dir=$(mktemp -d)
build/default/tools/ferry/ferry bench ingest --backend host --levels ideal,L0 --steps 3 --trace "$trace_dir/t.json" >/dev/null
build/default/tools/ferry/ferry analyze "$trace_dir/t.L0.json" --html "$trace_dir/t.L0.html" | grep -q "gpu_idle"
build/default/tools/ferry/ferry analyze tests/trace/data/kineto_naive.json | grep -q "'make batch'"
rm -rf "$trace_dir"

if [ "${FERRY_SKIP_SANITIZERS:-0}" != 1 ]; then
  step "cpu tests under ThreadSanitizer"
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j "$jobs"
  ctest --preset tsan -j "$jobs"

  step "cpu tests under AddressSanitizer + UBSan"
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"
fi

step "gpu tests"
if build/default/tools/ferry/ferry probe --backend cuda --bytes 1MiB --iterations 1 --no-pin-cost >/dev/null 2>&1; then
  ctest --preset gpu
else
  echo "gpu tests: NOT RUN (no GPU visible on this machine)"
fi
