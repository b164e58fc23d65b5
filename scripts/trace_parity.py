#!/usr/bin/env python3
"""Kernels and copies per step of one bench level, recorded twice: by ferry's in-process recorder
(`ferry bench ... --trace FILE`, a Chrome trace) and by `ferry trace -o DIR -- ferry bench ...` (process
files). Steps are the "step" spans; each step holds the GPU activity that starts between its start and the
next step's. Prints the median kernels and copies per step of each, and exits 1 when they differ."""
import json
import statistics
import sys
from pathlib import Path

KINDS = ["kernel", "memcpy", "memset", "sync", "api", "range", "stage"]


def per_step(steps, gpu):
    steps = sorted(steps)
    counts = []
    for i, s in enumerate(steps[:-1]):
        nxt = steps[i + 1]
        counts.append({k: sum(1 for t, kk in gpu if s <= t < nxt and kk == k) for k in ("kernel", "memcpy")})
    return counts


def from_chrome(path):
    data = json.loads(Path(path).read_text())
    steps, gpu = [], []
    for e in data["traceEvents"]:
        if e.get("ph") != "X":
            continue
        kind = e.get("args", {}).get("kind")
        ts = float(e["ts"])
        if kind in ("stage", "range") and e.get("name") == "step":
            steps.append(ts)
        elif kind in ("kernel", "memcpy"):
            gpu.append((ts, kind))
    return per_step(steps, gpu)


def from_session(directory):
    steps, gpu = [], []
    for f in Path(directory).glob("*.ferry-proc"):
        strings = {}
        for line in f.read_text().splitlines():
            if line.startswith("S "):
                head, _, text = line.partition("\t")
                strings[int(head.split()[1])] = text
            elif line.startswith("E "):
                v = line.split()
                kind, start, name, domain = KINDS[int(v[1])], int(v[2]) / 1000.0, int(v[9]), int(v[10])
                if kind == "range" and strings.get(name) == "step" and strings.get(domain) == "ferry":
                    steps.append(start)
                elif kind in ("kernel", "memcpy"):
                    gpu.append((start, kind))
    return per_step(steps, gpu)


def median(counts, k):
    return statistics.median(c[k] for c in counts) if counts else float("nan")


def main():
    inproc, session = from_chrome(sys.argv[1]), from_session(sys.argv[2])
    ok = True
    for k in ("kernel", "memcpy"):
        a, b = median(inproc, k), median(session, k)
        print(f"{k}s per step: in-process {a} ({len(inproc)} steps), ferry trace {b} ({len(session)} steps)")
        ok = ok and a == b
    print("parity:", "same" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
