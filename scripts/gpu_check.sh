#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root, with .carry/ made by scripts/gpu_carry.sh: the
# gpu-labelled suites on the cuda backend (plain and under compute-sanitizer), `ferry probe`, and the egress
# ladder at the reference shape with its pure-copy mode. Raw outputs go to $OUT; a summary table is last.
set -uo pipefail
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
c=.carry
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  memlock: $(ulimit -l)"
declare -A rc

echo "=== egress ladder, reference shape"
"$c/ferry" bench egress --backend cuda --json > "$out/egress.json" 2> "$out/egress.err"; rc[ladder]=$?
tail -n 3 "$out/egress.err"
echo "=== egress pure copy"
"$c/ferry" bench egress --backend cuda --pure-copy 20 --workers 14 --json > "$out/egress_pure_copy.json" 2>>"$out/egress.err"
rc[pure_copy]=$?

echo "=== gpu suites"
FERRY_TEST_BACKENDS=cuda "$c/ferry_device_tests" > "$out/device_cuda.log" 2>&1; rc[device]=$?
FERRY_TEST_BACKENDS=cuda "$c/ferry_egress_tests" > "$out/egress_cuda.log" 2>&1; rc[egress]=$?
tail -n 3 "$out/device_cuda.log" "$out/egress_cuda.log"

echo "=== compute-sanitizer"
for tool in memcheck racecheck synccheck; do
  FERRY_TEST_BACKENDS=cuda timeout 100 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 99 \
    "$c/ferry_egress_tests" --gtest_filter='*egress_pipeline*cuda*' > "$out/tmp_$tool.log" 2>&1
  rc[egress_$tool]=$?
  { echo "=== $tool"; cat "$out/tmp_$tool.log"; } >> "$out/sanitizer.log"; tail -n 2 "$out/tmp_$tool.log"; rm -f "$out/tmp_$tool.log"
done
FERRY_TEST_BACKENDS=cuda timeout 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
  "$c/ferry_device_tests" --gtest_filter='*cuda*' > "$out/tmp_device.log" 2>&1
rc[device_memcheck]=$?
{ echo "=== device memcheck"; cat "$out/tmp_device.log"; } >> "$out/sanitizer.log"; rm -f "$out/tmp_device.log"

echo "=== summary"
for k in "${!rc[@]}"; do echo "rc $k=${rc[$k]}"; done | sort
python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
try:
    j = json.load(open(os.path.join(out, "egress.json")))
    print(f'egress ladder on {j["device"]["name"]}: probed pinned D2H {j["probed_d2h_gbps"]:.2f} GB/s')
    for r in j["rows"]:
        print(f'  {r["level"]:<10} {r["steps_per_s"]:7.3f} steps/s  x{r["ratio_to_ideal"]:.3f}  '
              f'{r["d2h_gbps"]:6.2f} GB/s  {100*r["link_fraction"]:5.1f}% link  idle {100*r["gpu_idle"]:5.1f}%  '
              f'mismatch {r["mismatches"]}')
except Exception as e:
    print("egress.json unreadable:", e)
try:
    p = json.load(open(os.path.join(out, "egress_pure_copy.json")))
    print(f'pure copy: {p["gbps"]:.2f} GB/s end to end, {p["copy_gbps"]:.2f} GB/s copies, '
          f'{100*p["link_fraction"]:.1f}% of {p["probed_d2h_gbps"]:.2f}; mismatches {p["mismatches"]}')
except Exception as e:
    print("egress_pure_copy.json unreadable:", e)
PY
