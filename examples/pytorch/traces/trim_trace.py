#!/usr/bin/env python3
"""Trims a PyTorch profiler (Kineto) trace to a few ProfilerStep# spans, keeping it a valid trace.

    python3 examples/pytorch/traces/trim_trace.py IN.json[.gz] OUT.json[.gz] --first 6 --count 3

Keeps: every metadata record (process and thread names, device properties, the top-level fields such as
deviceProperties and distributedInfo); every CPU record (ops, runtime calls, annotations, instants,
counters) that starts inside the window running from the start of step `--first` to the end of the
last kept step; every GPU record (kernel, copy, memset, GPU annotation) launched by a kept runtime call
(same correlation id) or running during the window (so each kept step keeps all of its GPU time); flow arrows whose start is kept. The profiler's
own span ("PyTorch Profiler (0)") is clipped to the window. Nothing inside a kept record is changed.

Steps are numbered as in their names (ProfilerStep#6 is --first 6). Output ending in .gz is gzipped.
"""
import argparse
import gzip
import json
import os
import sys

GPU = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "gpu_user_annotation"}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def correlation(e):
    a = e.get("args", {})
    return a.get("correlation", a.get("correlation id"))


def trim(d, first, count):
    ev = d["traceEvents"]
    steps = {}
    for e in ev:
        n = str(e.get("name", ""))
        if e.get("ph") == "X" and n.startswith("ProfilerStep#"):
            steps[int(n.split("#", 1)[1])] = e
    wanted = [steps.get(i) for i in range(first, first + count)]
    if any(s is None for s in wanted):
        raise SystemExit(f"steps {first}..{first + count - 1} are not all in the trace (it has {sorted(steps)})")
    lo = wanted[0]["ts"]
    hi = wanted[-1]["ts"] + wanted[-1]["dur"]
    inside = lambda e: lo <= e["ts"] <= hi  # noqa: E731
    overlaps = lambda e: e["ts"] <= hi and e["ts"] + e.get("dur", 0) >= lo  # noqa: E731
    kept, launches, flows = [], set(), set()
    for e in ev:
        ph = e.get("ph")
        if ph == "M" or "ts" not in e:
            kept.append(e)
        elif str(e.get("name", "")).startswith("PyTorch Profiler"):
            s, t = max(e["ts"], lo), min(e["ts"] + e.get("dur", 0), hi)
            kept.append(dict(e, ts=s, dur=max(0, t - s)))
        elif e.get("cat") in GPU:
            continue  # decided below, once the kept launches are known
        elif ph in ("s", "f", "t"):
            continue
        elif inside(e):
            kept.append(e)
            c = correlation(e)
            if c is not None and ph == "X":
                launches.add(c)
    for e in ev:
        if e.get("cat") in GPU and "ts" in e and (correlation(e) in launches or overlaps(e)):
            kept.append(e)
    for e in ev:
        if e.get("ph") == "s" and inside(e):
            flows.add((e.get("cat"), e.get("id")))
    for e in ev:
        if e.get("ph") in ("s", "f", "t") and (e.get("cat"), e.get("id")) in flows:
            kept.append(e)
    out = {k: v for k, v in d.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out, len(ev)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--first", type=int, required=True, help="number of the first ProfilerStep# kept")
    p.add_argument("--count", type=int, required=True, help="how many steps to keep")
    a = p.parse_args()
    if a.count < 1:
        raise SystemExit(f"--count {a.count}: keep at least 1 step")
    out, before = trim(load(a.src), a.first, a.count)
    text = json.dumps(out, separators=(",", ":"))
    tmp = a.dst + ".partial"
    if a.dst.endswith(".gz"):
        with gzip.GzipFile(tmp, "wb", mtime=0) as f:  # mtime 0: the same input gives the same bytes
            f.write(text.encode())
    else:
        with open(tmp, "w") as f:
            f.write(text)
    os.replace(tmp, a.dst)
    print(f"{a.dst}: kept {len(out['traceEvents'])} of {before} records (steps {a.first}..{a.first + a.count - 1})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
