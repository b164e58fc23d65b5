#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root, with .carry/ made by scripts/gpu_carry.sh: every
# gpu-labelled suite on the cuda backend, CUPTI tracing and NVML topology through the run-time shim, and one
# run of each ladder at the reference shape. When .carry/ferry_baseline exists (the CLI of an earlier commit,
# FERRY_BASELINE_DIR=... scripts/gpu_carry.sh), both ladders run with it too, interleaved, so a change's
# effect on the figures is measured on one machine in one session. Raw outputs go to $OUT; a table is last.
set -uo pipefail
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out"
c=.carry
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat $c/commit 2>/dev/null)"
declare -A rc

echo "=== gpu suites (cuda backend)"
for t in device egress ingest; do
  FERRY_TEST_BACKENDS=cuda "$c/ferry_${t}_tests" > "$out/${t}_cuda.log" 2>&1; rc[suite_$t]=$?
  tail -n 1 "$out/${t}_cuda.log"
done

echo "=== NVML and CUPTI through the shim"
readelf -d "$c/ferry" | grep -i "cupti" && rc[links_cupti]=1 || rc[links_cupti]=0
"$c/ferry_shim_tests" > "$out/shim.log" 2>&1; rc[suite_shim]=$?; tail -n 1 "$out/shim.log"
"$c/ferry" probe --topology > "$out/topology.txt" 2>&1; rc[topology_text]=$?
"$c/ferry" probe --topology --json > "$out/topology.json" 2> "$out/topology.err"; rc[topology]=$?
"$c/ferry" bench egress --backend cuda --levels ideal,ferry --steps 3 --trace "$out/t/egress.json" \
  > "$out/traced.txt" 2>&1; rc[traced]=$?
grep -A3 "trace analysis" "$out/traced.txt" | head -n 5

runs=(new)
[ -x "$c/ferry_baseline" ] && runs+=(baseline)
for path in egress ingest; do
  for run in "${runs[@]}"; do
    bin="$c/ferry"; [ "$run" = baseline ] && bin="$c/ferry_baseline"
    echo "=== $path ladder ($run)"
    "$bin" bench "$path" --backend cuda --json > "$out/$path-$run.json" 2> "$out/$path-$run.err"
    rc[${path}_$run]=$?
  done
done

echo "=== summary"
for k in "${!rc[@]}"; do echo "rc $k=${rc[$k]}"; done | sort
python3 - "$out" "${runs[@]}" <<'PY'
import json, os, sys
out, runs = sys.argv[1], sys.argv[2:]
for path in ("egress", "ingest"):
    tables = {}
    for run in runs:
        try:
            tables[run] = {r["level"]: r for r in json.load(open(os.path.join(out, f"{path}-{run}.json")))["rows"]}
        except Exception as e:  # noqa: BLE001 - the table says which run is missing
            print(f"{path}-{run}.json unreadable: {e}")
    if not tables:
        continue
    print(f"{path}: ratio to ideal (steps/s)" + "".join(f"  {r:>18}" for r in tables))
    for level in next(iter(tables.values())):
        cells = []
        for run, rows in tables.items():
            r = rows.get(level)
            bad = r.get("mismatches", r.get("wrong", 0)) if r else 0
            cells.append(f"{r['ratio_to_ideal']:.3f} ({r['steps_per_s']:6.2f}){'!' if bad else ' '}" if r else "-")
        print(f"  {level:<10}" + "".join(f"  {c:>18}" for c in cells))
PY
