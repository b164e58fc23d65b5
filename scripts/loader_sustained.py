#!/usr/bin/env python3
"""The sustained rate of each level of examples/pytorch/loader_jpeg.py's --json output (also of runs
recorded before the example printed it): per level, the median [min-max] over its repeats of steps/s and
of the sustained steps/s, the lower of steps/s and the batches the workers made per second of the window
(samples_in_window / batch / seconds). A DataLoader holds up to prefetch_factor x N batches made before
the window and can hand them out in it; the sustained rate leaves them out.

    python3 scripts/loader_sustained.py docs/perf/.../loader-jpeg.json [...]
"""
import json
import statistics
import sys


def main(paths):
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        batch = d["config"]["batch"]
        groups = {}
        for r in d["levels"]:
            if r.get("error") or "samples_in_window" not in r or not r.get("seconds"):
                continue
            made = r["samples_in_window"] / batch / r["seconds"]
            groups.setdefault(r["level"].split("#")[0], []).append(
                (r["steps_per_s"], min(r["steps_per_s"], made), r["samples_in_window"] / batch, r["steps"]))
        if not groups:
            print(f"{path}: no level with samples_in_window (a run before the example recorded it, or no loader level)")
            continue
        print(f"{path}: level, steps/s, sustained steps/s (median [min-max]), batches made / consumed in each window")
        for level, rs in groups.items():
            def spread(v):
                return f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
            made = ", ".join(f"{m:.1f}/{n}" for _, _, m, n in rs)
            print(f"  {level:16} {spread([x[0] for x in rs]):>20} {spread([x[1] for x in rs]):>20}   {made}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
