#!/usr/bin/env bash
# ferry's main job on this machine: builds ferry and runs `ferry probe` (on the GPU when one is visible,
# else on the emulated host device). Extra arguments go to `ferry probe`, e.g. --json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh default >&2
build/default/tools/ferry/ferry probe "$@"
