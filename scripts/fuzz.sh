#!/usr/bin/env bash
# Builds a trace fuzzer with the fuzz preset (CMakePresets.json: clang++, libFuzzer + AddressSanitizer +
# UndefinedBehaviorSanitizer, into build/fuzz/; tests/fuzz/CMakeLists.txt declares the targets) and runs it
# over the seed corpus.
#
#   scripts/fuzz.sh [import|analyze] [SECONDS] [libFuzzer flags...]     SECONDS defaults to 60
#
# import (the default): the trace reader alone (parse, write back, read back equal).
# analyze: the reader and then the analyzer on whatever the reader accepts (tests/fuzz/trace_analyze_fuzz.cpp).
# Both start from tests/fuzz/corpus/trace_import/ (plain and gzip traces).
#
# Needs clang++ and libFuzzer (Debian: clang, libclang-rt-14-dev) and zlib (zlib1g-dev). New inputs go to
# build/fuzz/<target>/corpus; crashing inputs to build/fuzz/<target>/crashes/ (copy them into
# tests/fuzz/corpus/trace_import/ once fixed, so the GoogleTest replays keep them fixed). Exits nonzero on
# any finding. FUZZ_JOBS=N runs N workers; FERRY_JOBS compilers build (default: every core).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
target=import
case "${1:-}" in import|analyze) target=$1; shift ;; esac
seconds=${1:-60}
[ $# -gt 0 ] && shift
out=$root/build/fuzz/$target
seeds=$root/tests/fuzz/corpus/trace_import
jobs=${FUZZ_JOBS:-1}

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "trace_${target}_fuzz" -j "${FERRY_JOBS:-$(nproc)}"
binary=$root/build/fuzz/tests/fuzz/trace_${target}_fuzz
mkdir -p "$out/corpus" "$out/crashes"

# -timeout: one input taking this long counts as a hang. Parsing 64 KiB takes milliseconds; the bound is
# generous so that a busy machine (or a stalled process) is never reported as a hang.
args=(-max_len=65536 -max_total_time="$seconds" -timeout=120 -rss_limit_mb=2048 -print_final_stats=1
      -dict="$root/tests/fuzz/trace_import.dict" -artifact_prefix="$out/crashes/")
[ "$jobs" -gt 1 ] && args+=(-fork="$jobs" -ignore_crashes=0)
echo "fuzz: running for ${seconds}s over $seeds"
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
  "$binary" "${args[@]}" "$@" "$out/corpus" "$seeds"
