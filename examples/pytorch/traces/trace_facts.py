#!/usr/bin/env python3
"""Facts about a PyTorch profiler (Kineto) trace, computed independently of ferry.

    python3 examples/pytorch/traces/trace_facts.py TRACE.json[.gz] [...]

Prints, per trace: the PyTorch/Kineto format (old category spellings or new), the threads, the
ProfilerStep# spans, and per step (its window on the GPU, from the first GPU work the step launched) the GPU time split into kernels, copies (by kind), memsets and idle,
how much copy time overlapped kernels, the traced time after the last GPU activity, and the CPU
annotations (user ranges and top-level ops of the step-holding thread) that covered the most GPU idle
time. This is the cross-check behind each expectation in tests/data/real_traces/manifest.json: ferry's
analyzer must come to the same conclusion the plain numbers show.
"""
import argparse
import bisect
import collections
import gzip
import json
import sys

# Kineto's GPU categories: the current spellings and those of PyTorch 1.8/1.9 exports.
KERNEL = {"kernel", "Kernel"}
MEMCPY = {"gpu_memcpy", "Memcpy"}
MEMSET = {"gpu_memset", "Memset"}
RUNTIME = {"cuda_runtime", "Runtime", "cuda_driver"}
USER = {"user_annotation", "gpu_user_annotation"}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def covered(u, s, e):
    """Length of [s, e) covered by the sorted disjoint intervals u."""
    tot = 0.0
    for a, b in u:
        if b <= s:
            continue
        if a >= e:
            break
        tot += min(b, e) - max(a, s)
    return tot


def gaps(u, s, e):
    """The parts of [s, e) that u does not cover."""
    out, cur = [], s
    for a, b in u:
        if b <= cur:
            continue
        if a >= e:
            break
        if a > cur:
            out.append((cur, a))
        cur = max(cur, b)
    if cur < e:
        out.append((cur, e))
    return out


class Segments:
    """Disjoint, sorted (start, end, name) segments of one thread, searchable by time."""

    def __init__(self, segs):
        self.segs = segs
        self.starts = [x for x, _, _ in segs]

    def overlapping(self, a, b):
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        while i < len(self.segs) and self.segs[i][0] < b:
            if self.segs[i][1] > a:
                yield self.segs[i]
            i += 1


def innermost_segments(cpu):
    """Per thread, the timeline cut into segments each naming the innermost CPU event running then."""
    by_thread = collections.defaultdict(list)
    for c in cpu:
        by_thread[(c.get("pid"), str(c.get("tid")))].append(c)
    out = {}
    for key, evs in by_thread.items():
        evs.sort(key=lambda c: (c["ts"], -c["dur"]))
        segs, stack = [], []  # stack of (end, name); the top is the innermost open event
        cur = None

        def emit(upto):
            nonlocal cur
            if stack and cur is not None and upto > cur:
                segs.append((cur, upto, stack[-1][1]))
            cur = upto

        for c in evs:
            t = c["ts"]
            while stack and stack[-1][0] <= t:
                emit(stack[-1][0])
                stack.pop()
            emit(t)
            stack.append((min(t + c["dur"], stack[-1][0]) if stack else t + c["dur"], c["name"]))
        while stack:
            emit(stack[-1][0])
            stack.pop()
        out[key] = Segments(segs)
    return out


def copy_kind(ev):
    n = ev.get("name", "")
    for k in ("HtoD", "DtoH", "DtoD", "PtoP"):
        if k in n:
            return k
    return "other"


def gpu_windows(ev, gpu, steps):
    """Each step's window on the GPU: from the first GPU work launched inside its span to the first of the
    next step's (the last step ends with its last GPU work), so a CPU that runs ahead does not blur the
    steps. Launches are matched to GPU records by their correlation id."""
    by_corr = collections.defaultdict(list)
    for g in gpu:
        c = g.get("args", {}).get("correlation")
        if c is not None:
            by_corr[c].append(g)
    calls = sorted((e["ts"], e.get("args", {}).get("correlation")) for e in ev
                   if e.get("ph") == "X" and e.get("cat") in RUNTIME and "ts" in e)
    times = [t for t, _ in calls]
    spans = []
    for s in steps:
        lo, hi = bisect.bisect_left(times, s["ts"]), bisect.bisect_right(times, s["ts"] + s["dur"])
        launched = [g for _, c in calls[lo:hi] for g in by_corr.get(c, ())]
        if launched:
            spans.append((min(g["ts"] for g in launched), max(g["ts"] + g["dur"] for g in launched), s["name"]))
    spans.sort()
    return [(a, spans[i + 1][0] if i + 1 < len(spans) else b, n) for i, (a, b, n) in enumerate(spans)]


def facts(path, top=4):
    d = load(path)
    ev = [e for e in d.get("traceEvents", []) if isinstance(e, dict)]
    cats = collections.Counter(e.get("cat") for e in ev if e.get("ph") == "X")
    old = any(c in cats for c in ("Kernel", "Runtime", "Memcpy", "Operator"))
    tnames = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tnames[(e.get("pid"), str(e.get("tid")))] = e.get("args", {}).get("name", "")
    gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in KERNEL | MEMCPY | MEMSET]
    if not gpu:
        print(f"{path}: no GPU activity ({len(ev)} events; categories {dict(cats)})")
        return
    kern = union((e["ts"], e["ts"] + e["dur"]) for e in gpu if e["cat"] in KERNEL)
    busy = union((e["ts"], e["ts"] + e["dur"]) for e in gpu)
    # The CPU spans; Kineto repeats each on the GPU timeline as a gpu_user_annotation.
    steps = sorted((e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                    and e.get("cat") != "gpu_user_annotation"),
                   key=lambda e: e["ts"])
    step_tids = collections.Counter((s.get("pid"), str(s.get("tid"))) for s in steps)
    main = step_tids.most_common(1)[0][0] if step_tids else None
    cpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") not in KERNEL | MEMCPY | MEMSET | {"gpu_user_annotation"}
           and "dur" in e and not str(e.get("name", "")).startswith(("ProfilerStep#", "PyTorch Profiler"))]
    first_gpu = min(e["ts"] for e in gpu)
    last_gpu = max(e["ts"] + e["dur"] for e in gpu)
    trace_end = max(e["ts"] + e.get("dur", 0) for e in ev if "ts" in e and e.get("ph") in ("X", "i"))
    print(f"{path}")
    print(f"  format: {'old (PyTorch 1.8/1.9 categories)' if old else 'current'}; events {len(ev)}; "
          f"devices {sorted({e.get('pid') for e in gpu})}; streams {sorted({str(e.get('tid')) for e in gpu})}")
    print("  threads: " + ", ".join(f"{tid}={n!r}" for (_, tid), n in sorted(tnames.items(), key=str)))
    if main:
        print(f"  steps: {len(steps)} on thread {main[1]} ({tnames.get(main, '?')})")
    sync_neg = sum(1 for e in ev if e.get("cat") == "cuda_sync" and e.get("args", {}).get("stream") == -1)
    if sync_neg:
        print(f"  cuda_sync records with stream -1: {sync_neg}")
    print(f"  traced after the last GPU activity: {(trace_end - last_gpu) / 1e3:.2f} ms")
    windows = gpu_windows(ev, gpu, steps) or [(first_gpu, last_gpu, "whole trace")]
    print(f"  {'step':<18}{'wall ms':>9}{'kernel':>9}{'H2D':>8}{'D2H':>8}{'DtoD':>8}{'memset':>8}"
          f"{'idle':>8}{'idle%':>7}{'cp ovl':>8}")
    flat = innermost_segments(cpu)
    idle_by = collections.Counter()
    tot_idle = 0.0
    for s, e, name in windows:
        row = collections.Counter()
        cp, cp_ovl = 0.0, 0.0
        for g in gpu:
            a, b = max(g["ts"], s), min(g["ts"] + g["dur"], e)
            if b <= a:
                continue
            if g["cat"] in MEMCPY:
                row[copy_kind(g)] += b - a
                cp += b - a
                cp_ovl += covered(kern, a, b)
            elif g["cat"] in MEMSET:
                row["memset"] += b - a
        row["kernel"] = covered(kern, s, e)
        idle = (e - s) - covered(busy, s, e)
        tot_idle += idle
        print(f"  {name:<18}{(e - s) / 1e3:>9.2f}{row['kernel'] / 1e3:>9.2f}{row['HtoD'] / 1e3:>8.2f}"
              f"{row['DtoH'] / 1e3:>8.2f}{row['DtoD'] / 1e3:>8.2f}{row['memset'] / 1e3:>8.2f}"
              f"{idle / 1e3:>8.2f}{100 * idle / (e - s):>6.0f}%{(cp_ovl / cp if cp else 0):>8.2f}")
        for key, segs in flat.items():
            for a, b in gaps(busy, s, e):
                for x, y, n in segs.overlapping(a, b):
                    idle_by[(tnames.get(key, key[1]), n)] += min(b, y) - max(a, x)
    if tot_idle > 0:
        print("  CPU activity covering GPU idle (innermost per thread; threads overlap, so shares add past 100%):")
        for (t, n), v in idle_by.most_common(top):
            print(f"    {100 * v / tot_idle:5.1f}%  {t}: {n[:70]}")
    # Synchronous copies: the runtime call of a copy lasting at least as long as the copy itself.
    mem_calls = collections.Counter(e["name"] for e in ev if e.get("cat") in RUNTIME and "Memcpy" in e.get("name", ""))
    if mem_calls:
        print("  copy API calls: " + ", ".join(f"{n} x{c}" for n, c in mem_calls.items()))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=4)
    a = p.parse_args()
    for t in a.traces:
        try:
            facts(t, a.top)
        except (OSError, ValueError) as err:
            print(f"{t}: cannot read: {err}", file=sys.stderr)


if __name__ == "__main__":
    main()
