#!/usr/bin/env python3
"""Tables of `ferry bench allreduce --json` beside nccl-tests' all_reduce_perf output, for the
data-parallel runs' floor and latency commands (docs/perf/2026-11-2[67]/*-dp/README.md, "The stages' commands").

    allreduce_tables.py floor DIR       dp_floor's files: nccl-tests (sum, avg, mpirun) and ferry (blocking and
                                        nonblocking communicators, one process and mpirun) per size
    allreduce_tables.py latency DIR N   dp_latency's files for N GPUs: ferry against nccl-tests per size, with ratios
"""
import json
import os
import sys


def nccl_tests(path):
    """{size: (out-of-place us, busbw GB/s)} of an all_reduce_perf log; {} when it is missing."""
    rows = {}
    try:
        with open(path) as f:
            for line in f:
                cells = line.split()
                if len(cells) >= 8 and cells[0].isdigit():
                    rows[int(cells[0])] = (float(cells[5]), float(cells[7]))
    except OSError:
        pass
    return rows


def ferry(path):
    """{size: (out-of-place us, busbw GB/s)} of the fp32 rows of `ferry bench allreduce --json`."""
    try:
        with open(path) as f:
            doc = json.load(f)
        return {r["size"]: (r["out_of_place"]["time_us"], r["out_of_place"]["busbw"])
                for r in doc["rows"] if r["codec"] == "fp32"}
    except Exception as e:  # noqa: BLE001 -- the table says what is missing
        print(f"{os.path.basename(path)} unreadable: {e}")
        return {}


def floor(d):
    cols = {"nccl sum": nccl_tests(os.path.join(d, "nccl_tests_sum.txt")),
            "nccl avg": nccl_tests(os.path.join(d, "nccl_tests_avg.txt")),
            "nccl mpi": nccl_tests(os.path.join(d, "nccl_tests_mpi.txt")),
            "ferry": ferry(os.path.join(d, "ferry_blocking.json")),
            "ferry nonblock": ferry(os.path.join(d, "ferry_nonblocking.json")),
            "ferry mpi": ferry(os.path.join(d, "ferry_mpi_blocking.json")),
            "ferry mpi nonbl": ferry(os.path.join(d, "ferry_mpi_nonblocking.json"))}
    sizes = sorted(set().union(*[set(c) for c in cols.values()]))
    print("out-of-place us per call (busbw GB/s), 2 GPUs")
    print(f"{'bytes':>9}" + "".join(f"  {k:>17}" for k in cols))
    for s in sizes:
        cells = [f"{c[s][0]:7.1f} ({c[s][1]:6.1f})" if s in c else "-" for c in cols.values()]
        print(f"{s:>9}" + "".join(f"  {x:>17}" for x in cells))


def latency(d, n):
    for label, f, t in (("one process", ferry(os.path.join(d, f"allreduce_{n}.json")),
                         nccl_tests(os.path.join(d, f"nccl_tests_{n}.txt"))),
                        ("mpirun", ferry(os.path.join(d, f"allreduce_mpi_{n}.json")),
                         nccl_tests(os.path.join(d, f"nccl_tests_mpi_{n}.txt")))):
        print(f"{n} GPUs, {label}: size, ferry us, nccl-tests us, time ratio, ferry busbw, nccl-tests busbw, ratio")
        for size in sorted(f):
            fu, fb = f[size]
            tu, tb = t.get(size, (0, 0))
            print(f"  {size:>11} {fu:9.1f} {tu:9.1f} {fu / tu if tu else 0:6.2f} {fb:8.1f} {tb:8.1f} "
                  f"{fb / tb if tb else 0:6.3f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "floor":
        floor(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "latency":
        latency(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
