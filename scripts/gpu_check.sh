#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root, with .carry/ made by scripts/gpu_carry.sh:
# the gpu-labelled conformance suite on the cuda backend, then `ferry probe`, keeping raw outputs in $OUT.
set -uo pipefail
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
c=.carry
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,memory.total --format=csv | tee "$out/nvidia-smi.csv"
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  cpus: $(nproc)  memlock: $(ulimit -l)"

echo "=== conformance suite, cuda backend"
FERRY_TEST_BACKENDS=cuda "$c/ferry_device_tests" 2>&1 | tee "$out/device_cuda.log" | tail -n 40
conformance=${PIPESTATUS[0]}

echo "=== trace tests on the GPU machine"
"$c/ferry_trace_tests" 2>&1 | tail -n 3

echo "=== ferry probe (default options), table then --json"
"$c/ferry" probe --backend cuda 2>&1 | tee "$out/probe.txt"
"$c/ferry" probe --backend cuda --json > "$out/probe.json" 2>"$out/probe.err"
probe=$?
"$c/ferry" probe --backend cuda --bytes 1GiB --iterations 10 --no-pin-cost --json > "$out/probe_1gib.json" 2>/dev/null

echo "=== compute-sanitizer memcheck on the conformance suite"
if command -v compute-sanitizer >/dev/null; then
  FERRY_TEST_BACKENDS=cuda timeout 300 compute-sanitizer --tool memcheck --error-exitcode 99 "$c/ferry_device_tests" \
    > "$out/memcheck.log" 2>&1
  memcheck=$?
  tail -n 5 "$out/memcheck.log"
else
  memcheck=127
fi

echo "=== summary"
echo "memcheck: rc=$memcheck"
echo "conformance (cuda): rc=$conformance"
echo "probe --json: rc=$probe"
python3 - "$out/probe.json" "$out/probe_1gib.json" <<'PY'
import json, sys
for path in sys.argv[1:]:
    try:
        j = json.load(open(path))
    except Exception as e:
        print(path, "unreadable:", e); continue
    print(path.split('/')[-1], j["device"]["name"], j["options"]["copy_bytes"] >> 20, "MiB")
    for l in j["links"]:
        print(f'  {l["name"]:<14} {l["median_gbps"]:8.2f} GB/s  checked={l["checked"]}')
    d = j["both_directions"]
    print(f'  both ways      {d["total_gbps"]:8.2f} GB/s')
    if "pin_cost" in j:
        print(f'  pinning        {j["pin_cost"]["seconds_per_gib"]*1e3:8.1f} ms/GiB')
PY
exit $(( conformance != 0 || probe != 0 ))
