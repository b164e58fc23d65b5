#!/usr/bin/env bash
# ferry's main job on this machine: builds ferry, measures the link (`ferry probe`) and runs the
# device-to-host ladder (`ferry bench egress`): on the GPU when one is visible, else on the emulated host
# device with a small shape. Extra arguments go to `ferry bench egress`, e.g. --json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh default >&2
ferry=build/default/tools/ferry/ferry
$ferry probe
echo
$ferry bench egress "$@"
