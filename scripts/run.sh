#!/usr/bin/env bash
# ferry's main job on this machine: builds ferry, measures the link (`ferry probe`) and runs the
# host-to-device and device-to-host ladders (`ferry bench ingest`, `ferry bench egress`) and the
# data-parallel ladder (`ferry bench ddp`: gradient all-reduce beside backward): on the GPU when one is
# visible (ddp on 2 GPUs), else on the emulated host device with small shapes. Each level is traced and analyzed:
# under each ladder, what bounds every level and its fix; the traces (Chrome/Perfetto JSON) and HTML reports
# go to build/traces/. Extra arguments go to both benches, e.g. --json or --steps 20.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh default >&2
ferry=build/default/tools/ferry/ferry
$ferry probe
echo
$ferry bench ingest --trace build/traces/ingest.json "$@"
echo
$ferry bench egress --trace build/traces/egress.json "$@"
echo
$ferry bench ddp "$@"
