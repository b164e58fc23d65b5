#!/usr/bin/env python3
"""The recording cost of `ferry trace` on a program: its --json results of interleaved runs,
cost-<variant>-<i>.json in DIR (scripts/gpu.sh trace-cost program or api; variants plain, traced, lite, ...).
For tests/inject/api_cost.py's results, a table of each call's microseconds (medians) and what each variant
adds to it. For the examples' results, prints
the steps/s of each run of each level, the medians and each variant's cost (1 - variant / plain), then the
median CPU seconds per step of the main thread, the process' other threads and its children, where the
results hold them: what the recording adds to each."""
import json
import statistics
import sys
from pathlib import Path

CPU = (("main", "cpu_per_step_main_thread"), ("threads", "cpu_per_step_other_threads"),
       ("children", "cpu_per_step_children"))


def fmt(results):
    return " ".join(f"{r['steps_per_s']:.3f}" for r in results)


def main():
    d = Path(sys.argv[1])
    runs = {}  # variant -> level -> [result] (the examples)
    ops = {}  # variant -> op -> [us per call] (tests/inject/api_cost.py)
    for f in sorted(d.glob("cost-*-*.json")):
        variant = f.name.split("-")[1]
        result = json.loads(f.read_text())
        for lvl in result.get("levels", []):
            if lvl.get("steps_per_s"):
                runs.setdefault(variant, {}).setdefault(lvl["level"], []).append(lvl)
        for op, us in result.get("ops", {}).items():
            ops.setdefault(variant, {}).setdefault(op, []).append(us)
    if ops:
        names = ["plain"] + sorted(v for v in ops if v != "plain")
        print(f"{'us per call (median)':22}" + "".join(f"{v:>16}" for v in names))
        for op in ops.get("plain", {}):
            mp = statistics.median(ops["plain"][op])
            cells = [f"{mp:16.2f}"]
            for v in names[1:]:
                got = ops[v].get(op)
                m = statistics.median(got) if got else None
                cells.append(f"{m:9.2f} ({m - mp:+5.2f})" if got else f"{'-':>16}")
            print(f"{op:22}" + "".join(cells))
    variants = ["plain"] + sorted(v for v in runs if v != "plain")
    for level, plain in runs.get("plain", {}).items():
        mp = statistics.median(r["steps_per_s"] for r in plain)
        line = f"{level}: plain {fmt(plain)} steps/s (median {mp:.3f})"
        for variant in variants[1:]:
            other = runs[variant].get(level, [])
            if other:
                mt = statistics.median(r["steps_per_s"] for r in other)
                line += (f"; {variant} {fmt(other)} (median {mt:.3f}, "
                         f"cost {100 * (1 - mt / mp):+.2f}%)")
        print(line)
        for variant in variants:
            rs = runs[variant].get(level, [])
            parts = [(name, [r[key] for r in rs if r.get(key) is not None]) for name, key in CPU]
            if rs and all(v for _, v in parts):
                print(f"  {level} {variant}: CPU s/step (medians) "
                      + ", ".join(f"{name} {statistics.median(v):.4f}" for name, v in parts))


if __name__ == "__main__":
    main()
