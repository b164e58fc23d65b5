#!/usr/bin/env bash
# Builds a trace fuzzer (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer, clang++) straight from
# the sources it needs into build/fuzz/, and runs it over the seed corpus.
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
# any finding. FUZZ_JOBS=N runs N workers.
#
# Each source is compiled on its own into build/fuzz/obj/ (through ccache when it is installed; FUZZ_CCACHE
# names another launcher, or none with FUZZ_CCACHE=), with the same flags for both targets, so the two
# share the reader's objects and a rebuild compiles only what changed. FERRY_JOBS compilers run at once.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target=import
case "${1:-}" in import|analyze) target=$1; shift ;; esac
seconds=${1:-60}
[ $# -gt 0 ] && shift
out=$root/build/fuzz/$target
seeds=$root/tests/fuzz/corpus/trace_import
cxx=${FUZZ_CXX:-clang++}
jobs=${FUZZ_JOBS:-1}
build_jobs=${FERRY_JOBS:-$(nproc)}
launcher=${FUZZ_CCACHE-ccache}
[ -n "$launcher" ] && ! command -v "$launcher" >/dev/null && launcher=
objdir=$root/build/fuzz/obj

command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
mkdir -p "$out/corpus" "$out/crashes"

# The trace reader and writer are every file of src/trace/io/; the analyzer every file of src/analyze/.
sources=(
  "$root/tests/fuzz/trace_${target}_fuzz.cpp"
  "$root"/src/trace/io/*.cpp
  "$root/src/trace/timeline.cpp"
  "$root/src/core/atomic_file.cpp"
  "$root/src/core/error.cpp"
  "$root/src/core/fork.cpp"
  "$root/src/core/units.cpp"
  "$root/src/core/text.cpp"
)
headers=("$root"/src/trace/io/*.hpp)
# The same include paths for both targets: their shared objects are then the same compilation.
includes=(-I"$root/include" -I"$root/tests" -I"$root/src/analyze")
if [ "$target" = analyze ]; then
  sources+=("$root"/src/analyze/*.cpp "$root"/src/analyze/rules/*.cpp "$root/src/trace/names.cpp")
  headers+=("$root"/src/analyze/*.hpp "$root"/include/ferry/analyze/*.hpp)
fi
binary=$out/trace_${target}_fuzz
rebuild=0
[ -x "$binary" ] || rebuild=1
for f in "${sources[@]}" "${headers[@]}" "$root"/include/ferry/trace/*.hpp \
         "$root/include/ferry/core/error.hpp" "$root/tests/trace/timeline_compare.hpp" \
         "$root/tests/fuzz/source_location_shim.hpp" "$0"; do
  [ "$f" -nt "$binary" ] && rebuild=1
done
if [ $rebuild -eq 1 ]; then
  echo "fuzz: building $binary (${launcher:-no compiler cache}, $build_jobs at once)"
  flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
         -fno-sanitize-recover=undefined -DFMT_HEADER_ONLY "${includes[@]}"
         -include "$root/tests/fuzz/source_location_shim.hpp")
  objects=()
  running=0
  for src in "${sources[@]}"; do
    obj=$objdir/${src#"$root"/}.o
    objects+=("$obj")
    mkdir -p "$(dirname "$obj")"
    $launcher "$cxx" "${flags[@]}" -c "$src" -o "$obj" &
    running=$((running + 1))
    if [ $running -ge "$build_jobs" ]; then
      wait -n
      running=$((running - 1))
    fi
  done
  while [ $running -gt 0 ]; do
    wait -n
    running=$((running - 1))
  done
  "$cxx" -fsanitize=fuzzer,address,undefined "${objects[@]}" -lz -o "$binary.tmp"
  mv "$binary.tmp" "$binary"
fi

# -timeout: one input taking this long counts as a hang. Parsing 64 KiB takes milliseconds; the bound is
# generous so that a busy machine (or a stalled process) is never reported as a hang.
args=(-max_len=65536 -max_total_time="$seconds" -timeout=120 -rss_limit_mb=2048 -print_final_stats=1
      -dict="$root/tests/fuzz/trace_import.dict" -artifact_prefix="$out/crashes/")
[ "$jobs" -gt 1 ] && args+=(-fork="$jobs" -ignore_crashes=0)
echo "fuzz: running for ${seconds}s over $seeds"
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
  "$binary" "${args[@]}" "$@" "$out/corpus" "$seeds"
