#!/usr/bin/env bash
# Installs the Debian packages ferry builds and tests with. Idempotent: installs only what is missing,
# and touches the package lists only when something is. Needs root (or sudo) on a fresh machine.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  zlib1g-dev                  # gzip-compressed traces (.json.gz)
  python3 python3-numpy
  python3-pytest python3-torch                 # the Python package's tests (torch 1.13, CPU)
  python3-setuptools python3-wheel python3-pip python3-venv  # python3 -m pip install --no-build-isolation .
  python3-torchvision                          # the PyTorch examples' models (examples/pytorch), in tests/python
  python3-markdown-it                          # scripts/check_docs.py: the Markdown parsed as CommonMark (ctest docs_markdown)
  chromium fonts-dejavu-core  # renders the HTML report in the report test (headless)
  clang libclang-rt-14-dev    # libFuzzer for the trace importers' fuzz run
  clang-format clang-tidy     # scripts/lint.sh
  libjpeg62-turbo-dev         # <jpeglib.h> for the libjpeg-turbo shim (src/shim/jpeg.cpp); the library is opened at run time
  python3-pil                 # the reference decode of tests/python/test_image.py and scripts/bench_jpeg_cpu.py
  openmpi-bin libopenmpi-dev  # the MPI bootstrap: mpirun for its tests (ctest comm_mpi), <mpi.h> for the shim's checks
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
