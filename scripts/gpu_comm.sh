#!/usr/bin/env bash
# Runs on the lent 2-GPU machine (nvidia-h200-x2) from the repository root, with .carry/ made by
# scripts/gpu_carry.sh (with FERRY_NCCL_TESTS=<all_reduce_perf> it carries NVIDIA's nccl-tests binary too,
# built outside the repository by scripts/build_nccl_tests.sh). For each link, NVLink and NCCL_P2P_DISABLE=1
# (through host memory):
#   - `ferry bench allreduce` from 1 MiB to 2 GiB, fp32 and bf16, every element checked;
#   - the references at the same sizes: nccl-tests' all_reduce_perf (when carried) and PyTorch's
#     all_reduce (scripts/torch_allreduce.py);
#   - `ferry bench allreduce` again over two processes of an mpirun job (--bootstrap mpi, one GPU each),
#     from 8 B: what the one-process group's per-call cost owes to its threads;
#   - `ferry bench ddp`, every level, on the reference model and step (83 ms), in one process and again
#     over an mpirun job of one process per GPU (as DDP runs; its JSON only in raw.tgz and the summary).
# NCCL and cuBLAS come from the nvidia-nccl and nvidia-cublas Python packages (LD_LIBRARY_PATH is set from
# them). Raw outputs go to $OUT;
# a short table is printed last. Usage: scripts/gpu_comm.sh [all|allreduce|ddp] (default all); FERRY_GPUS
# (default 2) GPUs; FERRY_CARRY the folder of the carried binaries (default .carry).
set -uo pipefail
what=${1:-all}
# Everything is written to $raw; what comes back is ferry's four JSON results, summary.txt and raw.tgz
# (every file, the references' outputs and the logs included), under the device tool's 8-file limit.
final=${OUT:-/tmp/ferry-out}
out="$final/raw"
mkdir -p "$out"
c=${FERRY_CARRY:-.carry}
here=$(dirname "$0")
gpus=${FERRY_GPUS:-2}
nccl_dir=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
# cuBLAS for PowerSGD's products (bench ddp's powersgd level), from the nvidia-cublas package when there.
cublas_dir=$(python3 -c 'import nvidia.cublas; print(list(nvidia.cublas.__path__)[0])' 2>/dev/null || true)
export LD_LIBRARY_PATH="$nccl_dir/lib${cublas_dir:+:$cublas_dir/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.csv"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
echo "date: $(date -u +%FT%TZ)  cpus: $(nproc)  commit: $(cat "$c/commit" 2>/dev/null)  nccl: $nccl_dir"
declare -A rc

for link in nvlink p2p_off; do
  p2p=""
  [ "$link" = p2p_off ] && p2p="NCCL_P2P_DISABLE=1"
  if [ "$what" = all ] || [ "$what" = allreduce ]; then
    echo "=== allreduce, $link"
    env $p2p "$c/ferry" bench allreduce --backend cuda --gpus "$gpus" -b 1M -e 2G -f 2 -n 20 -w 5 \
      --codec fp32,bf16 --json > "$out/allreduce_$link.json" 2> "$out/allreduce_$link.err"
    rc[allreduce_$link]=$?
    if [ -x "$c/all_reduce_perf" ]; then
      env $p2p "$c/all_reduce_perf" -b 1M -e 2G -f 2 -g "$gpus" -n 20 -w 5 -c 1 \
        > "$out/nccl_tests_$link.txt" 2>&1
      rc[nccl_tests_$link]=$?
    fi
    env $p2p python3 "$here/torch_allreduce.py" --gpus "$gpus" -b 1M -e 2G -f 2 -n 20 -w 5 \
      > "$out/torch_$link.json" 2> "$out/torch_$link.err"
    rc[torch_$link]=$?
    if command -v mpirun >/dev/null; then
      env $p2p OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -n "$gpus" -x LD_LIBRARY_PATH \
        ${p2p:+-x NCCL_P2P_DISABLE} "$c/ferry" bench allreduce --bootstrap mpi -b 8 -e 2G -f 4 -n 20 -w 5 \
        --json > "$out/allreduce_mpi_$link.json" 2> "$out/allreduce_mpi_$link.err"
      rc[allreduce_mpi_$link]=$?
    fi
  fi
  if [ "$what" = all ] || [ "$what" = ddp ]; then
    echo "=== ddp, $link"
    env $p2p "$c/ferry" bench ddp --backend cuda --gpus "$gpus" --json > "$out/ddp_$link.json" 2> "$out/ddp_$link.err"
    rc[ddp_$link]=$?
    grep "plan of" "$out/ddp_$link.err"
    if command -v mpirun >/dev/null; then
      env $p2p OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -n "$gpus" -x LD_LIBRARY_PATH \
        ${p2p:+-x NCCL_P2P_DISABLE} "$c/ferry" bench ddp --bootstrap mpi --json \
        > "$out/ddp_mpi_$link.json" 2> "$out/ddp_mpi_$link.err"
      rc[ddp_mpi_$link]=$?
    fi
  fi
done

echo "=== summary"
for k in "${!rc[@]}"; do echo "rc $k=${rc[$k]}"; done | sort
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, os, sys
out = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception:  # noqa: BLE001 - the table says what is missing
        return None


def nccl_tests(name):
    """size -> out-of-place busbw from all_reduce_perf's table."""
    rows = {}
    try:
        for line in open(os.path.join(out, name)):
            f = line.split()
            if len(f) >= 8 and f[0].isdigit():
                rows[int(f[0])] = float(f[7])
    except OSError:
        pass
    return rows


for link in ("nvlink", "p2p_off"):
    ferry, torch, nt = load(f"allreduce_{link}.json"), load(f"torch_{link}.json"), nccl_tests(f"nccl_tests_{link}.txt")
    if ferry:
        fp32 = {r["size"]: r for r in ferry["rows"] if r["codec"] == "fp32"}
        bf16 = {r["size"]: r for r in ferry["rows"] if r["codec"] == "bf16"}
        tb = {r["size"]: r["busbw"] for r in torch["rows"]} if torch else {}
        print(f"all-reduce busbw GB/s, {link} (out of place; bf16: effbw of the fp32 bytes); #wrong {ferry['wrong']}")
        print(f"  {'size':>10} {'ferry':>8} {'nccl-t':>8} {'torch':>8} {'/nccl-t':>8} {'bf16 eff':>9}")
        for s, r in fp32.items():
            mine = r["out_of_place"]["busbw"]
            ref = nt.get(s)
            cell = lambda v: f"{v:8.1f}" if v else f"{'-':>8}"  # noqa: E731
            ratio = f"{mine / ref:8.3f}" if ref else f"{'-':>8}"
            eff = bf16[s]["out_of_place"]["effbw"] if s in bf16 else 0
            print(f"  {s:>10} {mine:8.1f} {cell(ref)} {cell(tb.get(s))} {ratio} {eff:9.1f}")
    for name in (f"ddp_{link}", f"ddp_mpi_{link}"):
      ddp = load(f"{name}.json")
      if ddp:
        print(f"{name}: steps/s, x single, hidden, exposed ms (auto: predicted), buckets (lossy), cap MiB, "
              f"mismatches, then per step on the compute stream: forward, backward, gap before the next step (ms); "
              f"auto: us a bucket takes from backward")
        for r in ddp["rows"]:
          pred = f" ({r['predicted_exposed_ms']:.2f})" if "predicted_exposed_ms" in r else ""
          per = f" {r['per_bucket_us']:.1f} us" if "per_bucket_us" in r else ""
          print(f"  {r['level']:<11} {r['steps_per_s']:7.3f} {r['ratio_to_ideal']:6.3f} {r.get('hidden', 0):6.1%} "
                f"{r.get('exposed_ms', 0):7.2f}{pred} {r.get('buckets', 0):5d} ({r.get('lossy_buckets', 0)}) "
                f"{r.get('cap_mib', 0):6.1f} {r['wrong']}  {r.get('forward_ms', 0):6.2f} {r.get('backward_ms', 0):6.2f} "
                f"{r.get('between_ms', 0):5.2f}{per}")
PY
for f in allreduce_nvlink.json allreduce_p2p_off.json allreduce_mpi_nvlink.json allreduce_mpi_p2p_off.json \
  ddp_nvlink.json ddp_p2p_off.json summary.txt; do
  [ -f "$out/$f" ] && cp "$out/$f" "$final/$f"
done
tar -czf "$final/raw.tgz" -C "$final" raw && rm -rf "$out"
