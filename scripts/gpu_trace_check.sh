#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root, with .carry/ made by scripts/gpu_carry.sh: the
# tracing checks of docs/PERFORMANCE.md. (1) the CUPTI recorder's conformance tests on cuda; (2) the
# recording cost: the egress ladder's ideal and ferry rows with and without --trace, alternating; (3) both
# ladders with --trace at the reference shapes (each level's bottleneck named); (4) a PyTorch profiler
# trace of a naive loop, analyzed; (5) ferry probe --topology. Raw outputs go to $OUT/trace-check.tar.gz.
set -uo pipefail
out=${OUT:-/tmp/ferry-out}
work=$(mktemp -d)
c=.carry
echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader | tee "$work/nvidia-smi.csv"
declare -A rc

echo "=== trace conformance on cuda"
FERRY_TEST_BACKENDS=cuda "$c/ferry_device_tests" --gtest_filter='*trace*' > "$work/trace_cuda.log" 2>&1; rc[trace_tests]=$?
tail -n 4 "$work/trace_cuda.log"

echo "=== topology"
"$c/ferry" probe --topology > "$work/topology.txt" 2>&1; rc[topology]=$?
"$c/ferry" probe --topology --json > "$work/topology.json" 2>>"$work/topology.txt"; rc[topology_json]=$?
cat "$work/topology.txt"

echo "=== recording cost: egress ideal+ferry, plain and traced, alternating (${FERRY_COST_ROUNDS:=3} rounds)"
for i in $(seq 1 "$FERRY_COST_ROUNDS"); do
  "$c/ferry" bench egress --backend cuda --levels ideal,ferry --probed-d2h 55 --json > "$work/cost_plain_$i.json" 2>>"$work/cost.err"
  rc[cost_plain_$i]=$?
  "$c/ferry" bench egress --backend cuda --levels ideal,ferry --probed-d2h 55 --json \
    --trace "$work/cost_traced_$i.json" > "$work/cost_traced_summary_$i.json" 2>>"$work/cost.err"
  rc[cost_traced_$i]=$?
done

echo "=== ladders with --trace"
"$c/ferry" bench ingest --backend cuda --json --trace "$work/ingest_trace.json" > "$work/ingest_ladder.json" 2> "$work/ingest_ladder.err"
rc[ingest_ladder]=$?
"$c/ferry" bench egress --backend cuda --json --trace "$work/egress_trace.json" > "$work/egress_ladder.json" 2> "$work/egress_ladder.err"
rc[egress_ladder]=$?

echo "=== PyTorch naive loop, analyzed"
python3 examples/pytorch/naive_loop.py --out "$work/kineto_naive.json" > "$work/naive.log" 2>&1; rc[torch]=$?
"$c/ferry" analyze "$work/kineto_naive.json" --html "$work/kineto_naive.html" > "$work/kineto_naive.txt" 2>&1; rc[analyze_torch]=$?
head -n 40 "$work/kineto_naive.txt"

echo "=== summary"
for k in "${!rc[@]}"; do echo "rc $k=${rc[$k]}"; done | sort
python3 - "$work" <<'PY'
import json, sys, os, glob
w = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception as e: print("unreadable", p, e); return None
plain, traced = [], []
for p in sorted(glob.glob(os.path.join(w, "cost_plain_*.json"))):
    j = load(p)
    if j: plain.append({r["level"]: r for r in j["rows"]})
for p in sorted(glob.glob(os.path.join(w, "cost_traced_summary_*.json"))):
    j = load(p)
    if j: traced.append({r["level"]: r for r in j["rows"]})
for name, runs in (("plain", plain), ("traced", traced)):
    for i, r in enumerate(runs):
        print(f'{name} {i+1}: ideal {r["ideal"]["steps_per_s"]:.4f}  ferry {r["ferry"]["steps_per_s"]:.4f} steps/s '
              f'x{r["ferry"]["ratio_to_ideal"]:.4f}  mismatches {r["ferry"]["mismatches"]}')
if plain and traced:
    mp = sum(r["ferry"]["steps_per_s"] for r in plain) / len(plain)
    mt = sum(r["ferry"]["steps_per_s"] for r in traced) / len(traced)
    print(f'recording cost on the ferry egress row: {100*(1-mt/mp):.2f}% (plain {mp:.4f}, traced {mt:.4f} steps/s)')
for lad in ("ingest", "egress"):
    j = load(os.path.join(w, f"{lad}_ladder.json"))
    if not j: continue
    for t in j.get("traces", []):
        ok = "ok" if t.get("bottleneck") == t.get("expected_finding") else "MISMATCH"
        print(f'{lad} {t["level"]:<10} events {t["events"]:>7} dropped {t["dropped"]}  bottleneck {t.get("bottleneck")}'
              f' (expected {t.get("expected_finding")}) {ok}')
    for r in j["rows"]:
        print(f'{lad} {r["level"]:<10} x{r["ratio_to_ideal"]:.3f} mismatches {r["mismatches"]}')
PY
tar -C "$work" -czf "$out/trace-check.tar.gz" . && ls -la "$out"
