"""Where a data-parallel step's host time goes, at world size 1 on one GPU (issue 38's first measurement).

    python3 scripts/dp_host_breakdown.py run [--model vit_l_32] [--dtype bfloat16] [--steps 20] [--time-hooks] --out DIR
    ferry trace -o DIR/rec -- python3 scripts/dp_host_breakdown.py run ... --out DIR
    python3 scripts/dp_host_breakdown.py analyze DIR/rec/trace.json DIR/levels.json

`run` trains the model alone ("plain"), under torch's DDP (100 MB buckets, gradients as bucket views,
static graph: DDP's best setting) and under ferry.torch.DataParallel, one after the other in one process,
each with `--warmup` untimed then `--steps` timed steps (zero_grad(set_to_none=True), SGD with momentum),
and writes DIR/levels.json: each level's steps/s (a host clock over the timed steps, after a device
synchronize) and the training-step numbers its steps have in a `ferry trace` recording (the Python
annotation counts optimizer steps from 0 in each process). At world size 1 there is no link: everything a
wrapper adds is its own host work.

`analyze` reads the recording: in each timed step, the main thread's `backward` range and, on the process's
other threads (the autograd engine's device thread runs backward on a GPU), the CUDA runtime calls recorded
inside it, summed by name; the rest of that thread's window is CPU work that is no runtime call (the
autograd engine, the gradient hooks and their ctypes calls, Python). Per level: the median backward window,
the runtime calls by name (ms per step, calls per step), and what is left. The launches and event records
are named by the runtime calls; hooks and ctypes are what the difference to "plain" leaves.
"""
import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict


def time_ferry_hooks() -> dict:
    """Puts a timer around the Python that ferry.torch.DataParallel runs in a backward (for every
    DataParallel made after): the hook on the forward's outputs that seats the gradients and arms the
    library's gradient hooks (which are C functions, not timed here: they are part of backward's own
    time), and the end-of-backward callback; returns the totals they add to: start_s, start_calls,
    finish_s."""
    from ferry.torch import _data_parallel as dp_module
    spent = {"start_s": 0.0, "start_calls": 0, "finish_s": 0.0}
    start, finish = dp_module.DataParallel._backward_starts, dp_module.DataParallel._finish

    def timed_start(self, grad):
        t = time.perf_counter()
        try:
            return start(self, grad)
        finally:
            spent["start_s"] += time.perf_counter() - t
            spent["start_calls"] += 1

    def timed_finish(self):
        t = time.perf_counter()
        try:
            return finish(self)
        finally:
            spent["finish_s"] += time.perf_counter() - t

    dp_module.DataParallel._backward_starts, dp_module.DataParallel._finish = timed_start, timed_finish
    return spent


def run(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision

    import ferry.torch
    from dp_common import images, one_gpu  # scripts/, this script's folder

    dev = one_gpu(args.port)
    dtype = getattr(torch, args.dtype)
    x, y = images(args.batch, dtype, dev)
    out = {"model": args.model, "dtype": args.dtype, "batch": args.batch, "steps": args.steps,
           "warmup": args.warmup, "torch": torch.__version__, "device": torch.cuda.get_device_name(dev),
           "levels": {}}
    step = 0  # the optimizer steps of this process so far: ferry trace's "step N" numbering
    spent = time_ferry_hooks() if args.time_hooks else {"start_s": 0.0, "start_calls": 0, "finish_s": 0.0}
    for level in args.levels.split(","):
        torch.manual_seed(0)
        model = getattr(torchvision.models, args.model)().to(dev, dtype)
        close = None
        if level == "plain":
            wrapped = model
        elif level == "ddp":
            wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=100,
                                                                gradient_as_bucket_view=True, static_graph=True)
        elif level == "ferry":
            wrapped = ferry.torch.DataParallel(model, plan="auto")
            close = wrapped.close
        else:
            raise SystemExit(f"--levels: unknown level {level!r} (plain, ddp, ferry)")
        opt = torch.optim.SGD(wrapped.parameters(), lr=1e-3, momentum=0.9)
        first = None
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                first = step
                spent.update(start_s=0.0, start_calls=0, finish_s=0.0)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(wrapped(x), y).backward()
            opt.step()
            step += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        row = {"steps_per_s": args.steps / seconds, "first_step": first, "last_step": step - 1,
               "parameters": sum(1 for p in model.parameters() if p.requires_grad)}
        extra = ""
        if args.time_hooks and level == "ferry":
            row.update(start_calls_per_step=spent["start_calls"] / args.steps,
                       start_ms_per_step=spent["start_s"] / args.steps * 1e3,
                       finish_ms_per_step=spent["finish_s"] / args.steps * 1e3)
            extra = (f"  backward's start {row['start_ms_per_step']:.2f} ms/step ({row['start_calls_per_step']:.0f} "
                     f"calls), end of backward {row['finish_ms_per_step']:.2f} ms")
        out["levels"][level] = row
        print(f"{level:6s} {args.steps / seconds:8.3f} steps/s{extra}", flush=True)
        if close is not None:
            close()
        del wrapped, model, opt
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "levels.json"), "w") as f:
        json.dump(out, f, indent=1)
    dist.destroy_process_group()


def analyze(trace_path: str, levels_path: str) -> dict:
    with open(trace_path) as f:
        doc = json.load(f)
    with open(levels_path) as f:
        levels = json.load(f)["levels"]
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    python = [e for e in events if e.get("args", {}).get("domain") == "ferry.python"]
    steps = {}
    for e in python:
        if e["name"].startswith("step "):
            steps[int(e["name"].split()[1])] = e
    backward = [e for e in python if e["name"] == "backward"]
    # CPU-side records of other threads than the main one: runtime calls and the like, not GPU work.
    gpu_cats = {"kernel", "memcpy", "memset"}
    cpu = defaultdict(list)
    for e in events:
        if e.get("cat") in gpu_cats or e.get("args", {}).get("domain") == "ferry.python":
            continue
        cpu[(e["pid"], e["tid"])].append(e)
    report = {}
    for level, info in levels.items():
        windows, by_name, calls, other, workers = [], defaultdict(float), defaultdict(int), [], set()
        for n in range(info["first_step"], info["last_step"] + 1):
            s = steps.get(n)
            if s is None:
                continue
            inside = [b for b in backward if b["pid"] == s["pid"] and b["ts"] >= s["ts"]
                      and b["ts"] + b["dur"] <= s["ts"] + s["dur"] + 1]
            if not inside:
                continue
            b = inside[0]
            lo, hi = b["ts"], b["ts"] + b["dur"]
            windows.append(b["dur"] / 1e3)
            # The backward's worker: the thread of this process with the most runtime time in the window.
            worker, best_sum, best_events = None, -1.0, []
            for (pid, tid), evs in cpu.items():
                if pid != b["pid"] or tid == b["tid"]:
                    continue
                ins = [e for e in evs if e["ts"] >= lo and e["ts"] + e["dur"] <= hi]
                total = sum(e["dur"] for e in ins)
                if total > best_sum:
                    worker, best_sum, best_events = tid, total, ins
            workers.add(worker)
            for e in best_events:
                by_name[e["name"]] += e["dur"] / 1e3
                calls[e["name"]] += 1
            other.append(b["dur"] / 1e3 - best_sum / 1e3)
        k = max(len(windows), 1)
        report[level] = {
            "steps_per_s": info["steps_per_s"], "steps_seen": len(windows), "worker_threads": sorted(
                w for w in workers if w is not None),
            "backward_ms_median": statistics.median(windows) if windows else None,
            "not_runtime_ms_median": statistics.median(other) if other else None,
            "runtime_ms_per_step": {n: round(v / k, 3) for n, v in sorted(by_name.items(), key=lambda t: -t[1])},
            "runtime_calls_per_step": {n: round(c / k, 1) for n, c in sorted(calls.items(), key=lambda t: -t[1])},
        }
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="vit_l_32")
    r.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--warmup", type=int, default=12)
    r.add_argument("--levels", default="plain,ddp,ferry")
    r.add_argument("--port", type=int, default=29541)
    r.add_argument("--out", required=True)
    r.add_argument("--time-hooks", action="store_true",
                   help="time ferry's gradient hooks and end-of-backward callback (adds a timer per call)")
    a = sub.add_parser("analyze")
    a.add_argument("trace")
    a.add_argument("levels")
    args = p.parse_args(argv)
    if args.what == "run":
        run(args)
        return 0
    rep = analyze(args.trace, args.levels)
    json.dump(rep, sys.stdout, indent=1)
    print()
    print(f"{'level':6s} {'steps/s':>8s} {'backward ms':>12s} {'not runtime ms':>15s}  top runtime calls (ms/step, calls)")
    for level, r in rep.items():
        top = ", ".join(f"{n} {v:.2f} ({r['runtime_calls_per_step'][n]:.0f})"
                        for n, v in list(r["runtime_ms_per_step"].items())[:4])
        bw = r["backward_ms_median"]
        nr = r["not_runtime_ms_median"]
        print(f"{level:6s} {r['steps_per_s']:8.3f} {bw if bw is None else round(bw, 2)!s:>12s} "
              f"{nr if nr is None else round(nr, 2)!s:>15s}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
