"""What the two PyTorch side-by-side examples share: the device they run on, timing, CPU time, the
result rows, the table and the --json output.

The examples run on a CUDA GPU, or with `--device cpu` on any machine (torch without CUDA): there the
streams and events below are stand-ins that do nothing, because every CPU operation has finished when it
returns. The levels keep their threads, processes, queues and checks, so the CPU run exercises the same
code paths (and checks every output) while it times nothing of interest.
"""
import contextlib
import datetime
import json
import os
import platform
import resource
import shlex
import sys
import time

import torch


class NullEvent:
    """A CUDA event's interface for the CPU device: work recorded before it is already done."""

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


class NullStream:
    """A CUDA stream's interface for the CPU device."""

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class Device:
    """The device a run uses: 'cuda' (the current CUDA device) or 'cpu'."""

    def __init__(self, name):
        if name == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is False; use --device cpu")
        if name not in ("cuda", "cpu"):
            raise SystemExit(f"--device {name!r}: expected 'cuda' or 'cpu'")
        self.name = name
        self.is_cuda = name == "cuda"
        self.torch_device = torch.device(name)

    def description(self):
        if self.is_cuda:
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            return f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {os.cpu_count()} CPUs"
        return f"CPU ({platform.processor() or platform.machine()}), {os.cpu_count()} CPUs"

    def stream(self):
        return torch.cuda.Stream() if self.is_cuda else NullStream()

    def current_stream(self):
        return torch.cuda.current_stream() if self.is_cuda else NullStream()

    def use_stream(self, s):
        return torch.cuda.stream(s) if self.is_cuda else contextlib.nullcontext()

    def event(self):
        return torch.cuda.Event() if self.is_cuda else NullEvent()

    def synchronize(self):
        if self.is_cuda:
            torch.cuda.synchronize()

    def pin(self, t):
        """`t` in page-locked memory on a GPU machine; unchanged on the CPU device."""
        return t.pin_memory() if self.is_cuda else t

    def empty_cache(self):
        if self.is_cuda:
            torch.cuda.empty_cache()


def host_register(t):
    """Page-locks the memory of host tensor `t` in place (cudaHostRegister), as the reference's fix for
    its shared pool did: `pin_memory()` followed by `share_memory_()` moves a tensor into new shared
    memory that is no longer pinned. Returns a function that unregisters it."""
    cudart = torch.cuda.cudart()
    ptr = t.data_ptr()
    err = cudart.cudaHostRegister(ptr, t.numel() * t.element_size(), 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {t.numel() * t.element_size()} bytes failed: error {int(err)}")
    return lambda: cudart.cudaHostUnregister(ptr)


def is_pinned(t):
    return t.is_pinned() if torch.cuda.is_available() else False


# ---- CPU time ------------------------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _live_children_cpu_seconds():
    """User + system CPU seconds of this process's live descendants (DataLoader workers, egress workers,
    and a forkserver's workers, which are its children and not ours), read from /proc, with what each
    has reaped of its own children: getrusage(RUSAGE_CHILDREN) counts only our children that have exited."""
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    kids, seconds = {}, {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        pid = int(name)
        kids.setdefault(int(fields[1]), []).append(pid)  # by ppid
        # utime, stime, and cutime, cstime (its exited children's)
        seconds[pid] = sum(int(x) for x in fields[11:15]) / _CLK_TCK
    total, descendants = 0.0, list(kids.get(me, ()))
    while descendants:  # depth first over the process tree below this process
        pid = descendants.pop()
        total += seconds[pid]
        descendants.extend(kids.get(pid, ()))
    return total


def _stat_cpu_seconds(path):
    """User + system CPU seconds from a /proc stat file, or None where there is none."""
    try:
        with open(path, "rb") as f:
            stat = f.read().decode()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def cpu_parts():
    """CPU seconds used so far: (main thread, the process's other threads, its child processes live or
    exited). The process and its main thread are read from /proc with the same clock-tick resolution, so
    their difference is never negative; without /proc the whole process counts as its main thread."""
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = c.ru_utime + c.ru_stime + _live_children_cpu_seconds()
    process = _stat_cpu_seconds("/proc/self/stat")
    main = _stat_cpu_seconds(f"/proc/self/task/{os.getpid()}/stat")
    if process is None or main is None:
        s = resource.getrusage(resource.RUSAGE_SELF)
        return s.ru_utime + s.ru_stime, 0.0, children
    return main, process - main, children


class Window:
    """The timed part of a level: wall seconds and CPU seconds (process + children) between begin()
    and end(), in total and as (main thread, other threads, children). end() must come after the device
    finished the timed work."""

    def __init__(self):
        self.wall = self.cpu = None
        self.parts = (0.0, 0.0, 0.0)
        self._t0 = self._c0 = None

    def begin(self):
        self._c0 = cpu_parts()
        self._t0 = time.perf_counter()

    def end(self):
        self.wall = time.perf_counter() - self._t0
        # Clock-tick sampling can leave a part a hair below zero over a short window.
        self.parts = tuple(max(0.0, b - a) for a, b in zip(self._c0, cpu_parts()))
        self.cpu = sum(self.parts)


# ---- results -------------------------------------------------------------------------------------

class Row:
    """One level's result."""

    def __init__(self, name, what):
        self.name = name
        self.what = what
        self.steps = 0
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.cpu_parts = (0.0, 0.0, 0.0)  # main thread, other threads, child processes
        self.bytes_moved = 0
        self.checked = 0
        self.mismatches = 0
        self.extra = {}
        self.error = None

    def set_window(self, steps, window):
        """The level's timed steps and the Window that timed them."""
        self.steps, self.seconds, self.cpu_seconds, self.cpu_parts = steps, window.wall, window.cpu, window.parts

    @property
    def steps_per_s(self):
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def to_json(self, ideal):
        return {
            "level": self.name,
            "what": self.what,
            "steps": self.steps,
            "seconds": self.seconds,
            "steps_per_s": self.steps_per_s,
            "x_ideal": (self.steps_per_s / ideal.steps_per_s) if ideal and ideal.steps_per_s > 0 else None,
            "gb_per_s": self.bytes_moved / self.seconds / 1e9 if self.seconds > 0 else 0.0,
            "cpu_seconds_per_step": self.cpu_seconds / self.steps if self.steps else None,
            "cpu_per_step_main_thread": self.cpu_parts[0] / self.steps if self.steps else None,
            "cpu_per_step_other_threads": self.cpu_parts[1] / self.steps if self.steps else None,
            "cpu_per_step_children": self.cpu_parts[2] / self.steps if self.steps else None,
            "checked_outputs": self.checked,
            "mismatches": self.mismatches,
            "error": self.error,
            **self.extra,
        }


def run_levels(levels, chosen, run_one):
    """Runs the chosen levels (names in `levels`' order is not required: the order of `chosen`), each
    through run_one(name) -> Row. A level that raises becomes a row with its error, so the others run."""
    rows = []
    for name in chosen:
        print(f"[{time.strftime('%H:%M:%S')}] level {name}: {levels[name]}", file=sys.stderr, flush=True)
        try:
            row = run_one(name)
        except Exception as e:  # noqa: BLE001 -- a failed level is reported in its row and the exit code
            row = Row(name, levels[name])
            row.error = f"{type(e).__name__}: {e}"
            print(f"level {name} failed: {row.error}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def parse_levels(text, levels):
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [c for c in chosen if c not in levels]
    if unknown or not chosen:
        raise SystemExit(f"--levels {text!r}: unknown level(s) {unknown}; known: {','.join(levels)}")
    return chosen


def print_table(rows, columns, title):
    """Prints rows as a table; columns are (header, width, fn(row, ideal) -> str)."""
    ideal = next((r for r in rows if r.name == "ideal" and r.error is None), None)
    print(title)
    print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w, _) in enumerate(columns)))
    for r in rows:
        if r.error:
            print(f"{r.name.ljust(columns[0][1])}  failed: {r.error}")
            continue
        print("  ".join(fn(r, ideal).rjust(w) if i else fn(r, ideal).ljust(w)
                        for i, (_, w, fn) in enumerate(columns)))


def ratio(r, ideal):
    return f"{r.steps_per_s / ideal.steps_per_s:.2f}" if ideal and ideal.steps_per_s > 0 else "-"


def write_json(path, dev, args, rows, extra=None):
    ideal = next((r for r in rows if r.name == "ideal" and r.error is None), None)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": dev.description(),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "config": vars(args),
        **(extra or {}),
        "levels": [r.to_json(ideal) for r in rows],
    }
    text = json.dumps(doc, indent=2)
    if path == "-":
        print(text)
    else:
        tmp = path + ".partial"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)  # the file appears under its name only when complete


def exit_code(rows):
    """0 when every level ran and every output checked out."""
    return 1 if any(r.error or r.mismatches for r in rows) else 0


class ReferencePrefetcher:
    """The hand-written prefetcher (ingest ladder L4): the next batch (x, y) is copied on a side stream
    while the current one computes; the consumer's stream waits on the side stream before using it, and
    record_stream keeps the batch alive for it."""

    def __init__(self, loader, dev):
        self.it = iter(loader)
        self.dev = dev
        self.stream = dev.stream()
        self.next = None
        self._preload()

    def _preload(self):
        try:
            x, y = next(self.it)
        except StopIteration:
            self.next = None
            return
        with self.dev.use_stream(self.stream):
            self.next = (x.to(self.dev.torch_device, non_blocking=True),
                         y.to(self.dev.torch_device, non_blocking=True))

    def __iter__(self):
        return self

    def __next__(self):
        self.dev.current_stream().wait_stream(self.stream)
        batch = self.next
        if batch is None:
            raise StopIteration
        if self.dev.is_cuda:
            for t in batch:
                t.record_stream(torch.cuda.current_stream())
        self._preload()
        return batch
