"""`ferry trace`'s Python annotation (python/ferry/_trace_site/sitecustomize.py) in child processes, over a
stub of libferry_inject.so that appends each call to a file: the ranges and steps of a small training
loop (DataLoader workers under fork and spawn), nothing when annotation is off or the library does not
record, the shadowed sitecustomize still run, and exceptions that pass through unchanged."""
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "python" / "ferry" / "_trace_site"

HEADER = ROOT / "include" / "ferry" / "trace" / "inject.h"


def sitecustomize_constants():
    """sitecustomize.py's protocol constants (_ENV_* and _FUNCTIONS), read without running it."""
    import ast
    out = {}
    for node in ast.parse((SITE / "sitecustomize.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.startswith("_ENV_") or name == "_FUNCTIONS":
                out[name] = ast.literal_eval(node.value)
    return out


def test_sitecustomize_speaks_the_protocol_of_the_header():
    """Its environment names are the header's, and its ctypes declarations of ferry_inject_* are the
    header's declarations in the header's order (as test_header.py proves ferry/_c.py against ferry.h)."""
    import re
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    env = dict(re.findall(r'#define FERRY_TRACE_ENV_(\w+) "(\w+)"', text))
    ours = sitecustomize_constants()
    names = {k[len("_ENV_"):]: v for k, v in ours.items() if k.startswith("_ENV_")}
    assert names and all(env.get(k) == v for k, v in names.items()), (names, env)
    c_types = {"void": None, "int": "c_int", "const char*": "c_char_p", "long long": "c_longlong"}

    def ctype(t):
        return c_types[re.sub(r"\s*\*", "*", " ".join(t.split()))]

    declared = []
    for ret, name, args in re.findall(r"^(\w[\w ]*?)\s+(ferry_inject_\w+)\(([^)]*)\);", text, flags=re.M):
        params = [] if args.strip() == "void" else [re.sub(r"\s*\b\w+$", "", a.strip()) for a in args.split(",")]
        declared.append((name, ctype(ret), tuple(ctype(p) for p in params)))
    assert len(declared) == 3 and tuple(declared) == ours["_FUNCTIONS"], (declared, ours["_FUNCTIONS"])


STUB = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* One write(2) per line on an O_APPEND file: lines of several processes never interleave. */
static void put(const char* line, int n) {
  const char* path = getenv("FERRY_STUB_OUT");
  if (path == NULL || n <= 0) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) != n) {}
  close(fd);
}

int ferry_inject_recording(void) {
  const char* r = getenv("FERRY_STUB_RECORDING");
  int on = r != NULL ? atoi(r) : 1;
  char b[128];
  put(b, snprintf(b, sizeof b, "recording\t%d\t%ld\t%d\n", (int)getpid(), (long)syscall(SYS_gettid), on));
  return on;
}

void ferry_inject_range(const char* name, const char* domain, long long start, long long end) {
  char b[1024];
  int n = snprintf(b, sizeof b, "range\t%d\t%ld\t%s\t%s\t%lld\t%lld\n", (int)getpid(),
                   (long)syscall(SYS_gettid), domain, name, start, end);
  put(b, n < (int)sizeof b ? n : 0);
}

void ferry_inject_step(long long index, long long start, long long end) {
  char b[256];
  put(b, snprintf(b, sizeof b, "step\t%d\t%ld\t%lld\t%lld\t%lld\n", (int)getpid(), (long)syscall(SYS_gettid),
                  index, start, end));
}
"""

# A small training loop; WORKERS and CONTEXT come from the command line.
TRAIN = """
import sys
torch_at_start = "torch" in sys.modules
import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, x):
        return self.body(x)


if __name__ == "__main__":
    workers, context = int(sys.argv[1]), sys.argv[2] if sys.argv[2] != "-" else None
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=4, num_workers=workers, multiprocessing_context=context)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("torch at start:", torch_at_start)
"""


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the stand-in for libferry_inject.so")
    d = tmp_path_factory.mktemp("inject")
    (d / "stub.c").write_text(STUB)
    lib = d / "libferry_inject_stub.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(d / "stub.c")], check=True)
    return lib


def run(stub, tmp_path, script, args=(), python="1", recording="1", extra_path=(), check=True):
    """Runs `script` in a child Python as `ferry trace` would; returns (records, completed process)."""
    out = tmp_path / "calls.tsv"
    if out.exists():
        out.unlink()
    path = tmp_path / "main.py"
    path.write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FERRY_TRACE", "FERRY_STUB"))}
    env.update(FERRY_TRACE_INJECT=str(stub), FERRY_TRACE_PYTHON=python, FERRY_STUB_OUT=str(out),
               FERRY_STUB_RECORDING=recording, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(SITE), *map(str, extra_path), str(ROOT / "python")]))
    proc = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True, text=True,
                          timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return parse(out), proc


def parse(out):
    records = []
    for line in (out.read_text().splitlines() if out.exists() else []):
        kind, pid, tid, *rest = line.split("\t")
        r = {"kind": kind, "pid": int(pid), "tid": int(tid)}
        if kind == "range":
            r.update(domain=rest[0], name=rest[1], start=int(rest[2]), end=int(rest[3]))
        elif kind == "step":
            r.update(index=int(rest[0]), start=int(rest[1]), end=int(rest[2]))
        else:
            r.update(on=int(rest[0]))
        records.append(r)
    return records


def ranges(records, pid=None, name=None):
    return [r for r in records if r["kind"] == "range" and (pid is None or r["pid"] == pid)
            and (name is None or r["name"] == name)]


def main_pid(records):
    return records[0]["pid"]  # the first process to ask the library is the program itself


def within(inner, outer):
    return outer["start"] <= inner["start"] <= inner["end"] <= outer["end"]


def check_training_loop(records, batches):
    """The main process's ranges and steps of TRAIN's loop: one step per batch, each holding its
    forward, backward and optimizer step in that order, all on the main thread."""
    main = main_pid(records)
    for r in ranges(records):
        assert r["domain"] == "ferry.python" and r["start"] <= r["end"], r
    mine = ranges(records, pid=main)
    names = Counter(r["name"] for r in mine if not r["name"].startswith("DataLoader fetch"))
    # One wait per batch and the last one that ends the epoch; no range for the nested modules.
    assert names == {"wait for a batch (DataLoader)": batches + 1, "forward (Net)": batches,
                     "backward": batches, "optimizer.step (SGD)": batches}, names
    assert {r["tid"] for r in mine} == {main}  # the main thread's id is the process id
    steps = [r for r in records if r["kind"] == "step"]
    assert [s["index"] for s in steps] == list(range(batches))
    assert {s["pid"] for s in steps} == {main} and {s["tid"] for s in steps} == {main}
    waits = ranges(records, main, "wait for a batch (DataLoader)")
    assert steps[0]["start"] == waits[0]["start"]
    for prev, s in zip(steps, steps[1:]):
        assert s["start"] == prev["end"]  # contiguous
    for i, s in enumerate(steps):
        fwd, bwd, opt = (ranges(records, main, n)[i] for n in ("forward (Net)", "backward", "optimizer.step (SGD)"))
        assert within(waits[i], s) and within(fwd, s) and within(bwd, s) and within(opt, s)
        assert waits[i]["end"] <= fwd["start"] <= fwd["end"] <= bwd["start"] <= bwd["end"] <= opt["start"]
        assert opt["end"] == s["end"]  # the optimizer step ends the training step


def test_a_training_loop_with_forked_workers_has_its_ranges_and_steps(stub, tmp_path):
    records, proc = run(stub, tmp_path, TRAIN, ["2", "fork"])
    assert "torch at start: False" in proc.stdout  # sitecustomize did not import torch
    check_training_loop(records, batches=8)
    main = main_pid(records)
    fetches = [r for r in ranges(records) if r["name"].startswith("DataLoader fetch")]
    assert len(fetches) == 8
    # Each worker is its own process, fetching on its one thread under its own id.
    by_pid = {}
    for r in fetches:
        by_pid.setdefault(r["pid"], set()).add((r["tid"], r["name"]))
    assert main not in by_pid and len(by_pid) == 2
    assert sorted(n for names in by_pid.values() for (_, n) in names) == \
        ["DataLoader fetch (worker 0)", "DataLoader fetch (worker 1)"]
    # A forked child asks the library again whether it records.
    asked = {r["pid"] for r in records if r["kind"] == "recording"}
    assert asked == {main, *by_pid}


def test_spawned_workers_run_the_annotation_again(stub, tmp_path):
    records, _ = run(stub, tmp_path, TRAIN, ["1", "spawn"])
    check_training_loop(records, batches=8)
    main = main_pid(records)
    fetches = [r for r in ranges(records) if r["name"].startswith("DataLoader fetch")]
    assert len(fetches) == 8
    assert {r["name"] for r in fetches} == {"DataLoader fetch (worker 0)"}
    (worker,) = {r["pid"] for r in fetches}
    assert worker != main
    # Every new interpreter asks the library (multiprocessing's resource tracker is one too).
    asked = {r["pid"]: r["on"] for r in records if r["kind"] == "recording"}
    assert asked[main] == 1 and asked[worker] == 1


OFF = """
import sys
at_start = sorted(m for m in ("torch", "ctypes") if m in sys.modules)
import torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Sequential(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4):
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("at start:", at_start)
"""


def test_nothing_is_loaded_or_recorded_when_annotation_is_off(stub, tmp_path):
    records, proc = run(stub, tmp_path, OFF, python="0")
    assert records == []  # the library was not even asked
    assert "at start: []" in proc.stdout  # neither torch nor ctypes was imported


def test_nothing_is_recorded_when_the_library_does_not_record(stub, tmp_path):
    records, proc = run(stub, tmp_path, OFF, recording="0")
    assert [(r["kind"], r["on"]) for r in records] == [("recording", 0)]
    assert "at start: ['ctypes']" in proc.stdout


CHAIN = """
import sys
import sitecustomize
print("ours:", sitecustomize.__file__)
print("order:", [m for m in sys.modules if m in ("shadowed_marker",)])
"""


def test_the_shadowed_sitecustomize_still_runs(stub, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import sys, types\nsys.modules['shadowed_marker'] = types.ModuleType('shadowed_marker')\n"
        "print('shadowed ran as', __name__)\n")
    records, proc = run(stub, tmp_path, CHAIN, extra_path=[other])
    assert proc.stdout.splitlines()[0] == "shadowed ran as sitecustomize"  # once, before the program
    assert proc.stdout.count("shadowed ran") == 1
    assert f"ours: {SITE / 'sitecustomize.py'}" in proc.stdout
    assert "order: ['shadowed_marker']" in proc.stdout
    assert [r["on"] for r in records if r["kind"] == "recording"] == [1]  # and ours still set up


def test_a_failing_shadowed_sitecustomize_is_reported_and_annotation_goes_on(stub, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('broken site')\n")
    records, proc = run(stub, tmp_path, CHAIN, extra_path=[other])
    assert "Error in sitecustomize" in proc.stderr and "RuntimeError: broken site" in proc.stderr
    assert [r["on"] for r in records if r["kind"] == "recording"] == [1]


EDGES = """
import threading
import traceback
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data._utils.pin_memory import pin_memory


class Boom(Exception):
    pass


class Inner(torch.nn.Module):
    def forward(self, x):
        raise Boom("inner", 42)


class Failing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x)


class Nested(torch.optim.SGD):
    def step(self, closure=None):
        return super().step(closure)


class BadStep(torch.optim.SGD):
    def step(self, closure=None):
        raise Boom("step")


x = torch.randn(2, 4)
try:
    Failing()(x)
except Boom as e:
    assert type(e) is Boom and e.args == ("inner", 42), e
    assert traceback.extract_tb(e.__traceback__)[-1].name == "forward"  # raised in Inner.forward
    print("forward raised Boom")
net = Net()
net(x).sum().backward()  # the flags were reset: this forward is a range again

t = threading.Thread(target=lambda: net(x))
t.start()
t.join()

pinned = pin_memory([[1, 2], {"a": (3, 4)}])  # recurses through the module's pin_memory
assert pinned == [[1, 2], {"a": [3, 4]}], pinned

for (b,) in DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2):
    pass

Nested(net.parameters(), lr=0.1).step()
try:
    BadStep(net.parameters(), lr=0.1).step()
except Boom as e:
    assert e.args == ("step",)
    print("step raised Boom")
print("thread", t.native_id)
"""


def test_exceptions_pass_through_and_nested_calls_are_one_range(stub, tmp_path):
    records, proc = run(stub, tmp_path, EDGES)
    assert "forward raised Boom" in proc.stdout and "step raised Boom" in proc.stdout
    main = main_pid(records)
    thread = int(proc.stdout.split("thread ")[1])
    seen = [(r["name"], r["tid"] == main) for r in ranges(records)]
    assert seen == [
        ("forward (Failing)", True),  # recorded although it raised; Inner is nested
        ("forward (Net)", True),
        ("backward", True),
        ("forward (Net)", False),  # the other thread's
        ("DataLoader pin_memory", True),  # one range for the recursive call
        ("DataLoader fetch (main process)", True),  # num_workers=0: fetched inside the wait
        ("wait for a batch (DataLoader)", True),
        ("DataLoader fetch (main process)", True),
        ("wait for a batch (DataLoader)", True),
        ("wait for a batch (DataLoader)", True),  # the end of the epoch
        ("optimizer.step (Nested)", True),  # super().step() is part of it
        ("optimizer.step (BadStep)", True),  # recorded although it raised
    ], seen
    assert [r["tid"] for r in ranges(records, name="forward (Net)")][1] == thread
    waits = ranges(records, name="wait for a batch (DataLoader)")
    fetches = ranges(records, name="DataLoader fetch (main process)")
    assert within(fetches[0], waits[0]) and within(fetches[1], waits[1])
    # Only the step that returned ends a training step; step 0 starts at the process's first range.
    steps = [r for r in records if r["kind"] == "step"]
    assert [(s["index"], s["start"], s["end"]) for s in steps] == \
        [(0, ranges(records)[0]["start"], ranges(records, name="optimizer.step (Nested)")[0]["end"])]


HOOKS = """
import types
import sitecustomize as site

# torch >= 2.0's global step hooks, as Optimizer.step's wrapper calls them (post hooks only on success).
pre, post = [], []
site._patch_optimizer(types.SimpleNamespace(register_optimizer_step_pre_hook=pre.append,
                                            register_optimizer_step_post_hook=post.append))


class Adam:
    pass


class Wrapper:
    pass


def step(opt, fails=False, inner=None):
    for h in pre:
        assert h(opt, (), {}) is None
    if inner is not None:
        step(inner)
    if not fails:
        for h in post:
            assert h(opt, (), {}) is None


class GradScaler:
    def step(self, opt, skip):
        if not skip:  # no inf/NaN in the gradients
            step(opt)


site._patch_grad_scaler(types.SimpleNamespace(GradScaler=GradScaler))
a, w, scaler = Adam(), Wrapper(), GradScaler()
step(a)
step(w, inner=a)  # a step inside another is part of it
step(a, fails=True)  # raised: no post hook
step(a)
scaler.step(a, skip=True)  # skipped the optimizer step: still the end of a training step
scaler.step(a, skip=False)  # one step, not two
print(len(pre), len(post))
"""


def test_torch2_optimizer_hooks_and_skipping_grad_scalers_end_one_step_each(stub, tmp_path):
    records, proc = run(stub, tmp_path, HOOKS)
    assert proc.stdout.split() == ["1", "1"]
    opt = ranges(records)
    assert [r["name"] for r in opt] == ["optimizer.step (Adam)", "optimizer.step (Wrapper)",
                                        "optimizer.step (Adam)", "optimizer.step (Adam)"]
    steps = [r for r in records if r["kind"] == "step"]
    assert [s["index"] for s in steps] == [0, 1, 2, 3, 4]
    ends = [s["end"] for s in steps]
    assert ends[:3] == [r["end"] for r in opt[:3]] and ends[4] == opt[3]["end"]
    assert opt[2]["end"] < ends[3] < opt[3]["start"]  # the skipping scaler's step
    assert steps[0]["start"] == opt[0]["start"]
    assert all(s["start"] == prev["end"] for prev, s in zip(steps, steps[1:]))
