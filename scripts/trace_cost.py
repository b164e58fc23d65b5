#!/usr/bin/env python3
"""The recording cost of `ferry trace` on a program: its --json results of interleaved runs,
cost-<variant>-<i>.json in DIR (scripts/gpu.sh trace-inject cost; variants plain, traced, lite, ...). Prints
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
    runs = {}  # variant -> level -> [result]
    for f in sorted(d.glob("cost-*-*.json")):
        variant = f.name.split("-")[1]
        for lvl in json.loads(f.read_text())["levels"]:
            if lvl.get("steps_per_s"):
                runs.setdefault(variant, {}).setdefault(lvl["level"], []).append(lvl)
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
