#!/usr/bin/env python3
"""The CUDA calls a `ferry trace` recording holds, per thread and per training step: what CUPTI
instrumented on each thread, to set against what one call costs under the recording
(scripts/gpu.sh trace-cost api). Reads the merged trace.json of DIR; a step is one
'optimizer.step (...)' range of the automatic Python annotation (the whole recording counts as one step
when there is none).

    scripts/trace_calls.py DIR [--top N]
"""
import argparse
import collections
import json
import sys
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--top", type=int, default=8, help="the most frequent calls named per thread (default 8)")
    args = p.parse_args()
    path = args.dir / "trace.json" if args.dir.is_dir() else args.dir
    if not path.is_file():
        sys.exit(f"trace_calls: {path} is not a file: give a `ferry trace` output directory or its trace.json")
    trace = json.loads(path.read_text())
    names = {}  # (pid, tid) -> thread name
    calls = collections.defaultdict(collections.Counter)  # (pid, tid) -> api name -> count
    syncs = collections.Counter()  # (pid, tid) -> sync records
    kernels = collections.Counter()  # pid of the GPU group -> kernels
    steps = collections.Counter()  # pid -> optimizer steps
    for e in trace.get("traceEvents", []):
        ph, pid, tid = e.get("ph"), e.get("pid"), e.get("tid")
        if ph == "M" and e.get("name") == "thread_name":
            names[(pid, tid)] = e["args"]["name"]
        if ph != "X":
            continue
        cat = e.get("cat")
        if cat == "api":
            calls[(pid, tid)][e["name"]] += 1
        elif cat == "sync":
            syncs[(pid, tid)] += 1
        elif cat == "kernel":
            kernels[pid] += 1
        elif cat == "range" and e["name"].startswith("optimizer.step"):
            steps[pid] += 1
    if not calls:
        sys.exit(f"trace_calls: {path} holds no CUDA runtime calls (recorded with --lite, or no CUDA)")
    gpu_pids = sorted({pid for pid, _ in calls})
    for pid in gpu_pids:
        n = steps[pid] or 1
        k = sum(c for g, c in kernels.items() if g % 1_000_000_000 == pid)
        print(f"process {pid}: {n} steps{'' if steps[pid] else ' (no optimizer.step range: the whole recording)'}"
              f", {k / n:.0f} kernels a step")
        for (p2, tid), counter in sorted(calls.items(), key=lambda kv: -sum(kv[1].values())):
            if p2 != pid:
                continue
            total = sum(counter.values())
            top = ", ".join(f"{name} {c / n:.0f}" for name, c in counter.most_common(args.top))
            print(f"  {names.get((pid, tid), tid)}: {total / n:.0f} runtime calls a step "
                  f"({syncs[(pid, tid)] / n:.1f} sync records): {top}")


if __name__ == "__main__":
    main()
