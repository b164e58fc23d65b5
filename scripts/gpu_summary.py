#!/usr/bin/env python3
"""The summaries of scripts/gpu.sh's workloads: each reads the work folder of one workload run (its steps'
NAME.json results and NAME.log outputs) and prints its tables. gpu.sh calls it last, as
`gpu_summary.py KIND [ARGS...] DIR`; it also reads a folder unpacked from a run's WORKLOAD-MODE.tgz again.
A missing or unreadable result is named in the table, never fatal: the summary of a failed run says what
is missing."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(path: Path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # noqa: BLE001 - the table says what is missing
        print(f"{path.name} unreadable: {e}")
        return None


def lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def tails(d: Path, n: str, *names: str) -> None:
    """The last N lines of each named step's log (the examples print their own tables last)."""
    for name in names:
        log = d / f"{name}.log"
        if log.exists():
            print(f"--- {name}")
            print("\n".join(lines(log)[-int(n):]))


def ladders(d: Path, *runs: str) -> None:
    """Both ladders' ratio to ideal per level and run (new, baseline), egress's link figures, pure copy."""
    for path in ("egress", "ingest"):
        tables = {}
        for run in runs:
            if (d / f"{path}-{run}.json").exists():
                j = load(d / f"{path}-{run}.json")
                if j:
                    tables[run] = j
        if not tables:
            continue
        first = next(iter(tables.values()))
        if "device" in first:
            print(f"{path} ladder on {first['device'].get('name')}"
                  + (f": probed pinned D2H {first['probed_d2h_gbps']:.2f} GB/s" if "probed_d2h_gbps" in first else ""))
        print(f"{path}: ratio to ideal (steps/s); ! marks mismatches" + "".join(f"  {r:>18}" for r in tables))
        rows = {run: {r["level"]: r for r in j["rows"]} for run, j in tables.items()}
        for level in next(iter(rows.values())):
            cells = []
            for run_rows in rows.values():
                r = run_rows.get(level)
                bad = r.get("mismatches", r.get("wrong", 0)) if r else 0
                cells.append(f"{r['ratio_to_ideal']:.3f} ({r['steps_per_s']:6.2f}){'!' if bad else ' '}" if r else "-")
            print(f"  {level:<10}" + "".join(f"  {c:>18}" for c in cells))
        if path == "egress":
            for r in first["rows"]:
                # The ceiling (ideal) moves and checks nothing: its link figures are null.
                if r.get("d2h_gbps") is None:
                    continue
                print(f"  {r['level']:<10} {r['d2h_gbps']:6.2f} GB/s  {100 * r['link_fraction']:5.1f}% link  "
                      f"idle {100 * r['gpu_idle']:5.1f}%")
    if (d / "egress-pure_copy.json").exists():
        p = load(d / "egress-pure_copy.json")
        if p:
            print(f"egress pure copy: {p['gbps']:.2f} GB/s end to end, {p['copy_gbps']:.2f} GB/s copies, "
                  f"{100 * p['link_fraction']:.1f}% of {p['probed_d2h_gbps']:.2f}; mismatches {p['mismatches']}")
    topo = lines(d / "topology.log")
    if topo:
        print("topology:")
        print("\n".join("  " + t for t in topo[:12]))


def nccl_tests(path: Path) -> dict[int, float]:
    """size -> out-of-place busbw from all_reduce_perf's table."""
    rows = {}
    for line in lines(path):
        f = line.split()
        if len(f) >= 8 and f[0].isdigit():
            rows[int(f[0])] = float(f[7])
    return rows


def comm(d: Path) -> None:
    """bench allreduce beside nccl-tests and PyTorch per link; bench ddp in one process and over mpirun."""
    for link in ("nvlink", "p2p_off"):
        ferry = load(d / f"allreduce_{link}.json") if (d / f"allreduce_{link}.json").exists() else None
        if ferry:
            torch = load(d / f"torch_{link}.json") if (d / f"torch_{link}.json").exists() else None
            nt = nccl_tests(d / f"nccl_tests_{link}.log")
            fp32 = {r["size"]: r for r in ferry["rows"] if r["codec"] == "fp32"}
            bf16 = {r["size"]: r for r in ferry["rows"] if r["codec"] == "bf16"}
            tb = {r["size"]: r["busbw"] for r in torch["rows"]} if torch else {}
            print(f"all-reduce busbw GB/s, {link} (out of place; bf16: effbw of the fp32 bytes); #wrong {ferry['wrong']}")
            print(f"  {'size':>10} {'ferry':>8} {'nccl-t':>8} {'torch':>8} {'/nccl-t':>8} {'bf16 eff':>9}")
            for s, r in fp32.items():
                mine = r["out_of_place"]["busbw"]
                ref = nt.get(s)
                ratio = f"{mine / ref:8.3f}" if ref else f"{'-':>8}"
                eff = bf16[s]["out_of_place"]["effbw"] if s in bf16 else 0
                ref_cell = f"{ref:8.1f}" if ref else f"{'-':>8}"
                tb_cell = f"{tb[s]:8.1f}" if tb.get(s) else f"{'-':>8}"
                print(f"  {s:>10} {mine:8.1f} {ref_cell} {tb_cell} {ratio} {eff:9.1f}")
        for name in (f"ddp_{link}", f"ddp_mpi_{link}"):
            if not (d / f"{name}.json").exists():
                continue
            ddp = load(d / f"{name}.json")
            if not ddp:
                continue
            for plan in (x for x in lines(d / f"{name}.log") if "plan of" in x):
                print(f"{name}: {plan.strip()}")
            print(f"{name}: steps/s, x single, hidden, exposed ms (auto: predicted), buckets (lossy), cap MiB, "
                  f"mismatches, then per step on the compute stream: forward, backward, gap before the next step (ms); "
                  f"auto: us a bucket takes from backward")
            for r in ddp["rows"]:
                pred = f" ({r['predicted_exposed_ms']:.2f})" if "predicted_exposed_ms" in r else ""
                per = f" {r['per_bucket_us']:.1f} us" if "per_bucket_us" in r else ""
                print(f"  {r['level']:<11} {r['steps_per_s']:7.3f} {r['ratio_to_ideal']:6.3f} {r.get('hidden', 0):6.1%} "
                      f"{r.get('exposed_ms', 0):7.2f}{pred} {r.get('buckets', 0):5d} ({r.get('lossy_buckets', 0)}) "
                      f"{r.get('cap_mib', 0):6.1f} {r['wrong']}  {r.get('forward_ms', 0):6.2f} {r.get('backward_ms', 0):6.2f} "
                      f"{r.get('between_ms', 0):5.2f}{per}")


def comm_local(d: Path, *variants: str) -> None:
    """Per variant: allreduce's microseconds a call by size, ddp's steps/s and ratio to single; nccl-tests."""
    for v in variants:
        p = d / f"allreduce_1gpu_{v}.json"
        if p.exists() and p.stat().st_size:
            rows = (load(p) or {}).get("rows", [])
            print(f"{v} allreduce us/call (out of place):",
                  " ".join(f"{r['size']}:{r['out_of_place']['time_us']:.1f}" for r in rows))
        p = d / f"ddp_1gpu_{v}.json"
        if p.exists() and p.stat().st_size:
            for r in (load(p) or {}).get("rows", []):
                print(f"{v} ddp {r['level']}: {r['steps_per_s']:.3f} steps/s ratio {r['ratio_to_ideal']:.4f}"
                      f" buckets {r.get('buckets')} backward {r.get('backward_ms', 0):.2f} ms wrong {r['wrong']}")
    for line in lines(d / "nccl_tests_1gpu.log"):
        f = line.split()
        if len(f) > 5 and f[0].isdigit():
            print("nccl-tests", f[0], f[5])


def cell(r, key, spec):
    return format(r[key], spec) if r and r.get(key) is not None else "-"


def vit_ddp(d: Path) -> None:
    """steps/s of each level per link against single and the best DDP; ferry's plan; the convergence guard."""
    runs = {}
    for name in ("nvlink", "p2p_off"):
        if (d / name).is_dir():
            v = load(d / name / "results.json")
            if v:
                runs[name] = {r["level"]: r for r in v["levels"]}
    if runs:
        print("steps/s (x single, x best DDP) per link; best DDP marked *")
        print(f"  {'level':<13}" + "".join(f"  {k:>26}" for k in runs))
        for level in next(iter(runs.values())):
            cells = []
            for rows in runs.values():
                r = rows.get(level)
                if not r or r["status"] != "ok":
                    cells.append((r["status"] if r else "-")[:26])
                else:
                    best = "*" if r.get("x_best_ddp") == 1.0 and level.startswith("ddp") else " "
                    cells.append(f"{r['steps_per_s']:7.3f} ({cell(r, 'x_single', '.3f')}, {cell(r, 'x_best_ddp', '.3f')}){best}")
            print(f"  {level:<13}" + "".join(f"  {c:>26}" for c in cells))
        for link, rows in runs.items():
            for level, r in rows.items():
                if r["status"] != "ok":
                    print(f"  {link} {level}: {r['status']}: {r.get('skipped') or r.get('error')}")
                elif r.get("ferry_stats"):
                    s = r["ferry_stats"]
                    mib = ", ".join(f"{b / 2**20:.1f}" for b in (s.get("plan") or {}).get("bucket_bytes") or [])
                    print(f"  {link} {level}: buckets (MiB) [{mib}], codecs {s.get('codecs')}, learning {s.get('learning')}, "
                          f"decided {json.dumps(s.get('decided'))[:300]}" + (f"; {r['note']}" if r.get("note") else ""))
    conv = load(d / "convergence" / "results.json") if (d / "convergence").is_dir() else None
    if conv:
        print(f"convergence: {conv['config']['model']}, {conv['config']['convergence']} steps; "
              f"largest relative loss difference to {conv['reference']} at any step")
        for r in conv["levels"]:
            if r["status"] == "ok":
                print(f"  {r['level']:<13} final loss {r['final_loss']:.4f}  max rel diff {r['max_rel_diff']:.3e} "
                      f"(step {r['max_rel_diff_step']})")
            else:
                print(f"  {r['level']:<13} {r['status']}: {r.get('skipped') or r.get('error')}")


def first_finding(path: Path) -> str:
    for line in lines(path):
        if re.match(r"^  1\. ", line):
            return line.strip()
    return "(no finding)"


def trace_smoke(d: Path, *parts: str) -> None:
    """Parity of the ladders' L1 with the in-process recorder, torch.profiler inside, the examples' analyses."""
    if "bench" in parts:
        for bench in ("egress", "ingest"):
            print(f"== {bench} L1: parity with the in-process recorder")
            print("\n".join(lines(d / f"parity-{bench}.log")))
            print(f"  ferry trace: {first_finding(d / f'{bench}-analysis.log')}")
            print(f"  in process:  {first_finding(d / f'inproc-{bench}-analysis.log')}")
    if "kineto" in parts:
        print("== torch.profiler inside")
        out = lines(d / "kineto.log")
        print("\n".join([x for x in out if "torch.profiler CUDA events" in x] + out[-3:]))
        print("\n".join(x for x in lines(d / "kineto-analysis.log") if "note" in x.lower()))
    for x in ("seg", "train"):
        if x in parts:
            print(f"== {x}")
            print("\n".join(lines(d / f"{x}.log")[-2:] + lines(d / f"{x}-analysis.log")[:12]))
            analysis = lines(d / f"{x}-analysis.log")
            for i, line in enumerate(analysis):
                if line.startswith("Findings"):
                    print("\n".join(analysis[i:i + 3]))


def trace_findings(d: Path) -> None:
    """Each recorded level's first finding."""
    for a in sorted(d.glob("*-analysis.log")):
        print(f"{a.name[:-len('-analysis.log')]}: {first_finding(a)}")


def trace_ladders(d: Path) -> None:
    """Each traced level's events, drops and bottleneck against the expected one; the naive loop analyzed."""
    for lad in ("ingest", "egress"):
        j = load(d / f"{lad}_ladder.json") if (d / f"{lad}_ladder.json").exists() else None
        if not j:
            continue
        for t in j.get("traces", []):
            ok = "ok" if t.get("bottleneck") == t.get("expected_finding") else "MISMATCH"
            print(f'{lad} {t["level"]:<10} events {t["events"]:>7} dropped {t["dropped"]}  bottleneck {t.get("bottleneck")}'
                  f' (expected {t.get("expected_finding")}) {ok}')
        for r in j["rows"]:
            print(f'{lad} {r["level"]:<10} x{r["ratio_to_ideal"]:.3f} mismatches {r["mismatches"]}')
    naive = lines(d / "kineto_naive.log")
    if naive:
        print("naive PyTorch loop, analyzed:")
        print("\n".join(naive[:40]))


def trace_cost_bench(d: Path) -> None:
    """The in-process recorder's cost on the egress ladder's ferry row: plain against traced, per round."""
    plain, traced = [], []
    for kind, runs in (("plain", plain), ("traced", traced)):
        for p in sorted(d.glob(f"cost_{kind}_*.json")):
            j = load(p)
            if j:
                runs.append({r["level"]: r for r in j["rows"]})
        for i, r in enumerate(runs):
            print(f'{kind} {i + 1}: ideal {r["ideal"]["steps_per_s"]:.4f}  ferry {r["ferry"]["steps_per_s"]:.4f} steps/s '
                  f'x{r["ferry"]["ratio_to_ideal"]:.4f}  mismatches {r["ferry"]["mismatches"]}')
    if plain and traced:
        mp = sum(r["ferry"]["steps_per_s"] for r in plain) / len(plain)
        mt = sum(r["ferry"]["steps_per_s"] for r in traced) / len(traced)
        print(f"recording cost on the ferry egress row: {100 * (1 - mt / mp):.2f}% (plain {mp:.4f}, traced {mt:.4f} steps/s)")


def trace_cost(d: Path) -> None:
    """The first round's `ferry trace` lines, analyses (per rank, stragglers) and CUDA calls; trace_cost.py's tables."""
    for log in sorted(d.glob("cost-*-1.log")):
        print("\n".join(x for x in lines(log)[-3:] if "ferry trace" in x))
    for a in sorted(d.glob("analysis-*.log")):
        v = a.name[len("analysis-"):-len(".log")]
        text = lines(a)
        for i, line in enumerate(text):
            if line.startswith(("Per rank", "Straggler")):
                print("\n".join(f"{v}: {x}" for x in text[i:i + 13]))
    for c in sorted(d.glob("calls-*.log")):
        v = c.name[len("calls-"):-len(".log")]
        print("\n".join(f"{v}: {x}" for x in lines(c)))
    sys.stdout.flush()
    subprocess.run([sys.executable, str(HERE / "trace_cost.py"), str(d)], check=False)


KINDS = {
    "tails": tails, "ladders": ladders, "comm": comm, "comm-local": comm_local, "vit-ddp": vit_ddp,
    "trace-smoke": trace_smoke, "trace-findings": trace_findings, "trace-ladders": trace_ladders,
    "trace-cost-bench": trace_cost_bench, "trace-cost": trace_cost,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in KINDS:
        print(__doc__)
        print("Kinds:")
        for k, v in KINDS.items():
            print(f"  {k:<17} {(v.__doc__ or '').strip()}")
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    kind, *args, folder = argv
    d = Path(folder)
    if not d.is_dir():
        print(f"gpu_summary: {folder} is not a folder", file=sys.stderr)
        return 2
    try:
        KINDS[kind](d, *args)
    except Exception as e:  # noqa: BLE001 - a result of another shape: say where the summary stopped
        print(f"gpu_summary {kind}: stopped at {type(e).__name__}: {e} (the raw outputs are in the archive)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
