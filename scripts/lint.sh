#!/usr/bin/env bash
# clang-format and clang-tidy over ferry's C++ (.clang-format, .clang-tidy). CI runs it from
# scripts/test.sh after the default build, whose compile_commands.json clang-tidy reads.
#   scripts/lint.sh            check the whole tree (format: every tracked C++ file; tidy: src/ and tools/)
#   scripts/lint.sh --fix      rewrite files in place with clang-format (tidy still only reports)
#   scripts/lint.sh FILE...    check only these files
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FERRY_LINT_BUILD:-build/default}
jobs=${FERRY_JOBS:-$(nproc)}
fix=0
if [ "${1:-}" = --fix ]; then fix=1; shift; fi

if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' ':!:tests/trace/data/*')
fi

echo "lint: clang-format on ${#files[@]} files"
if [ $fix -eq 1 ]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run --Werror "${files[@]}"
fi

# clang-tidy reads the build's compile commands; CUDA sources (.cu) are nvcc's and are left out.
mapfile -t tidy < <(printf '%s\n' "${files[@]}" | grep -E '^(src|tools)/.*\.cpp$' || true)
if [ ${#tidy[@]} -eq 0 ]; then
  # run-clang-tidy given no file would check every file of the build.
  echo "lint: clang-tidy: no C++ source of src/ or tools/ among the files given"
  echo "lint: ok"
  exit 0
fi
[ -f "$build/compile_commands.json" ] || { echo "lint: $build/compile_commands.json missing: build first" >&2; exit 2; }
echo "lint: clang-tidy on ${#tidy[@]} files"
# clang 14 with libstdc++ 12 lacks std::source_location; the fuzz build's shim supplies it. fmt is read
# as declarations (-UFMT_HEADER_ONLY): its implementation, which the build compiles into every object, is
# fmt's code, not ferry's, and parsing and analyzing it again in every file cost about 3 s a file.
run-clang-tidy -quiet -p "$build" -j "$jobs" \
  -extra-arg=-include -extra-arg="$PWD/tests/fuzz/source_location_shim.hpp" -extra-arg=-UFMT_HEADER_ONLY \
  "${tidy[@]/#/$PWD/}" > "$build/clang-tidy.log" 2>&1 || {
    grep -E "(warning|error):" "$build/clang-tidy.log" | sort -u | head -50
    echo "lint: clang-tidy found problems (full log: $build/clang-tidy.log)" >&2
    exit 1
  }
echo "lint: ok"
