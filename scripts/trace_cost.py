#!/usr/bin/env python3
"""The recording cost of `ferry trace` on a PyTorch example: its --json results of interleaved runs,
cost-plain-<i>.json and cost-traced-<i>.json in DIR (scripts/gpu.sh trace-inject cost). Prints the steps/s
of each run of each level, the medians and the cost (1 - traced / plain)."""
import json
import statistics
import sys
from pathlib import Path


def main():
    d = Path(sys.argv[1])
    runs = {"plain": {}, "traced": {}}
    for kind in runs:
        for f in sorted(d.glob(f"cost-{kind}-*.json")):
            for lvl in json.loads(f.read_text())["levels"]:
                runs[kind].setdefault(lvl["level"], []).append(lvl["steps_per_s"])
    for level, plain in runs["plain"].items():
        traced = runs["traced"].get(level, [])
        if not plain or not traced:
            continue
        mp, mt = statistics.median(plain), statistics.median(traced)
        print(f"{level}: plain {' '.join(f'{x:.3f}' for x in plain)} steps/s (median {mp:.3f}); "
              f"traced {' '.join(f'{x:.3f}' for x in traced)} (median {mt:.3f}); cost {100 * (1 - mt / mp):+.2f}%")


if __name__ == "__main__":
    main()
