#!/usr/bin/env python3
"""The recording cost of `ferry trace` on a program: its --json results of interleaved runs,
cost-<variant>-<i>.json in DIR (scripts/gpu.sh trace-inject cost; variants plain, traced, lite). Prints the
steps/s of each run of each level, the medians and each variant's cost (1 - variant / plain)."""
import json
import statistics
import sys
from pathlib import Path


def main():
    d = Path(sys.argv[1])
    runs = {}
    for f in sorted(d.glob("cost-*-*.json")):
        variant = f.name.split("-")[1]
        for lvl in json.loads(f.read_text())["levels"]:
            if lvl.get("steps_per_s"):
                runs.setdefault(variant, {}).setdefault(lvl["level"], []).append(lvl["steps_per_s"])
    for level, plain in runs.get("plain", {}).items():
        mp = statistics.median(plain)
        line = f"{level}: plain {' '.join(f'{x:.3f}' for x in plain)} steps/s (median {mp:.3f})"
        for variant in sorted(v for v in runs if v != "plain"):
            other = runs[variant].get(level, [])
            if other:
                mt = statistics.median(other)
                line += (f"; {variant} {' '.join(f'{x:.3f}' for x in other)} (median {mt:.3f}, "
                         f"cost {100 * (1 - mt / mp):+.2f}%)")
        print(line)


if __name__ == "__main__":
    main()
