#!/usr/bin/env bash
# Configures and builds one CMake preset (default: "default"), installing dependencies first.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
scripts/setup.sh
jobs=${FERRY_JOBS:-$(nproc)}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
