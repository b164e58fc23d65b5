#!/usr/bin/env bash
# Runs on a lent one-GPU machine (nvidia-h100-x1 or nvidia-h200) from the repository root, with .carry/ made
# by scripts/gpu_carry.sh: what ferry's communication path costs on one GPU, where no link hides it.
#   - `ferry bench allreduce --gpus 1` from 8 B to 1 GiB, fp32 and bf16: the cost of one call (NCCL at
#     world size 1 copies nothing in place) and the codecs' own time, beside nccl-tests' all_reduce_perf
#     -g 1 when carried;
#   - `ferry bench ddp --gpus 1`: the reducer's and the codecs' local cost a step (ceiling: `single`);
#   - the same ddp levels again with --trace: the CUPTI timeline of each level and its analysis.
# With FERRY_BASELINE_DIR given to gpu_carry.sh, .carry/ferry_baseline (and any other carried
# .carry/ferry_v*) runs the first two as well, for an A/B of the same machine and minute. Raw outputs go
# to $OUT (raw.tgz holds every file); a table is printed last. Usage: scripts/gpu_one_gpu_comm.sh;
# FERRY_CARRY the carried binaries' folder (default .carry); FERRY_LEVELS the ddp levels and
# FERRY_TRACE_LEVELS the traced ones (default: the same).
set -uo pipefail
final=${OUT:-/tmp/ferry-out}
out="$final/raw"
mkdir -p "$out/trace"
c=${FERRY_CARRY:-.carry}
nccl_dir=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
cublas_dir=$(python3 -c 'import nvidia.cublas; print(list(nvidia.cublas.__path__)[0])' 2>/dev/null || true)
export LD_LIBRARY_PATH="$nccl_dir/lib${cublas_dir:+:$cublas_dir/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat "$c/commit" 2>/dev/null)  nccl: $nccl_dir"
levels=${FERRY_LEVELS:-single,25MB,100MB,bf16,auto}
variants="ferry"
for v in ferry_baseline $(cd "$c" && ls -d ferry_v* 2>/dev/null); do
  [ -x "$c/$v" ] && variants="$variants $v"
done
declare -A rc
for v in $variants; do
  echo "=== $v: allreduce, 1 GPU"
  "$c/$v" bench allreduce --backend cuda --gpus 1 -b 8 -e 1G -f 4 -n 100 -w 10 --codec fp32,bf16 --json \
    > "$out/allreduce_1gpu_$v.json" 2> "$out/allreduce_1gpu_$v.err"
  rc[allreduce_$v]=$?
  echo "=== $v: ddp, 1 GPU ($levels)"
  "$c/$v" bench ddp --backend cuda --gpus 1 --levels "$levels" --json \
    > "$out/ddp_1gpu_$v.json" 2> "$out/ddp_1gpu_$v.err"
  rc[ddp_$v]=$?
done
if [ -x "$c/all_reduce_perf" ]; then
  "$c/all_reduce_perf" -b 8 -e 64M -f 4 -g 1 -n 100 -w 10 -c 1 > "$out/nccl_tests_1gpu.txt" 2>&1
  rc[nccl_tests]=$?
fi
echo "=== ferry: ddp, 1 GPU, traced"
"$c/ferry" bench ddp --backend cuda --gpus 1 --levels "${FERRY_TRACE_LEVELS:-$levels}" \
  --trace "$out/trace/ddp.json" --json > "$out/ddp_1gpu_traced.json" 2> "$out/ddp_1gpu_traced.err"
rc[ddp_traced]=$?

tar -czf "$final/raw.tgz" -C "$out" .
{
  for k in "${!rc[@]}"; do echo "rc $k ${rc[$k]}"; done
  # shellcheck disable=SC2086  # one argument per variant
  python3 - "$out" $variants <<'PY'
import json, sys, os
out = sys.argv[1]
for v in sys.argv[2:]:
    p = f"{out}/allreduce_1gpu_{v}.json"
    if os.path.exists(p) and os.path.getsize(p):
        rows = json.load(open(p)).get("rows", [])
        print(f"{v} allreduce us/call (out of place):",
              " ".join(f"{r['size']}:{r['out_of_place']['time_us']:.1f}" for r in rows))
    p = f"{out}/ddp_1gpu_{v}.json"
    if os.path.exists(p) and os.path.getsize(p):
        for r in json.load(open(p)).get("rows", []):
            print(f"{v} ddp {r['level']}: {r['steps_per_s']:.3f} steps/s ratio {r['ratio_to_ideal']:.4f}"
                  f" buckets {r.get('buckets')} backward {r.get('backward_ms', 0):.2f} ms wrong {r['wrong']}")
PY
  grep -E "^ +[0-9]+ " "$out/nccl_tests_1gpu.txt" 2>/dev/null | awk '{print "nccl-tests", $1, $6}'
} | tee "$final/summary.txt"
