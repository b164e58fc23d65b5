"""ferry.torch.Loader on ferry's host backend (no GPU): worker processes write samples into shared slots
that ferry registers and prefetches. Order, shuffling, epochs, sharding by rank, per-sample seeds
independent of the worker count, sample structures, refusals, a worker's exception and death, shutdown
(close, del, break, Ctrl-C, the parent killed), and after every test: no worker left, no file added to
/dev/shm, no descriptor leaked."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import namedtuple
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
import ferry.torch as ft  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def Loader(*args, **kwargs):
    """ferry.torch.Loader with forked workers unless a test says otherwise: pytest's process has threads,
    so the default would start a forkserver (slower, and the test datasets need none)."""
    kwargs.setdefault("start_method", "fork")
    return ft.Loader(*args, **kwargs)
Pair = namedtuple("Pair", "image label")


def children() -> set:
    """Live processes whose parent is this one, but multiprocessing's own helpers (the resource tracker
    that spawn starts, a forkserver), which live as long as this process."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    helpers = {getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
               getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)}
    me, out = os.getpid(), set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and int(d) not in helpers:
            out.add(int(d))
    return out


_cuda_opened = False


def _open_cuda_once():
    """Where the tests use the GPU: CUDA's first use in a process (torch's and ferry's) opens descriptors
    (the driver's device files) that live as long as the process, so it happens before any test counts."""
    global _cuda_opened
    if _cuda_opened or "cuda" not in os.environ.get("FERRY_TEST_BACKENDS", "").split(","):
        return
    _cuda_opened = True
    with Loader(Numbers(4), batch_size=2, workers=1, device="cuda") as warm:
        assert [int(y.sum()) for _, y in warm] == [1, 5]


# Files other programs make in /dev/shm while this suite runs beside them (ctest runs two suites at once):
# Open MPI's shared-memory transport, from the comm_mpi test's mpirun. Neither ferry nor torch makes these.
FOREIGN_SHM = ("vader_segment.", "sm_segment.")


def shm_files():
    return {f for f in os.listdir("/dev/shm") if not f.startswith(FOREIGN_SHM)}


@pytest.fixture(autouse=True)
def no_leaks():
    # multiprocessing's helpers (spawn's resource tracker, the forkserver) keep a descriptor here for the
    # life of the process: started first, so they are not counted as the test's.
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    multiprocessing.resource_tracker.ensure_running()
    multiprocessing.forkserver.ensure_running()
    _open_cuda_once()
    shm, fds, kids = shm_files(), set(os.listdir("/proc/self/fd")), children()
    yield
    deadline = time.monotonic() + 5
    while children() - kids and time.monotonic() < deadline:
        time.sleep(0.02)
    assert children() - kids == set(), "worker processes outlived the test"
    assert shm_files() - shm == set(), "files left in /dev/shm"
    leaked = set(os.listdir("/proc/self/fd")) - fds
    assert len(leaked) <= 1, f"descriptors leaked: {leaked}"  # one: the listing's own, gone already or not


@pytest.fixture
def dev(backend):
    """Where the batches go: ferry's host backend ("cpu"), or the GPU where FERRY_TEST_BACKENDS names cuda
    (the memfd registered with cudaHostRegister, written by forked workers, copied by the copy engine)."""
    return "cuda" if backend == "cuda" else "cpu"


class Numbers:
    """Sample i: a 3x4 uint8 image of value i % 251 and the label i."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 4), i % 251, dtype=torch.uint8), i


class Random:
    """Sample i: draws from torch, numpy and random, which the Loader seeded for this sample."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        import random
        return torch.rand(5), np.random.rand(3), random.random(), i


class Structured:
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return {"pair": Pair(np.full((2, 2), i, np.float32), i), "mask": np.array([i % 2 == 0, True]),
                "weight": float(i) / 2, "id": np.int16(i)}


class WhereMade:
    """Sample i: which worker made it, how many there are, and what worker_init_fn left for the dataset."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = ft.worker_info()
        return info.id, info.workers, info.seed == ft.sample_seed(4, 0, i), _INIT.get("ran", -1), i


_INIT = {}


def init_worker(wid):
    _INIT["ran"] = wid


class Fails:
    def __init__(self, at, how="raise"):
        self.at, self.how = at, how

    def __len__(self):
        return 30

    def __getitem__(self, i):
        if i == self.at:
            if self.how == "raise":
                raise KeyError(f"no sample {i} here")
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "shape":
                return torch.zeros(3, 5, dtype=torch.uint8), i
            if self.how == "dtype":
                return torch.zeros(3, 4, dtype=torch.int32), i
        return torch.full((3, 4), i, dtype=torch.uint8), i


class Views:
    """Read-only views into one array, as a memory-mapped dataset returns."""

    def __init__(self):
        self.data = np.arange(24 * 1000, dtype=np.uint8).reshape(24, 1000)
        self.data.flags.writeable = False

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return self.data[i]


class Strided:
    """Sample i: leaves that are views with every kind of stride: an image's channels-first view of its
    channels-last bytes (PILToTensor's permute), 4-channel and cropped too, a transposed float matrix, a
    flipped numpy array, a broadcast row and a lazily conjugated complex vector."""

    def __len__(self):
        return 11

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        hwc = torch.randint(0, 256, (9, 7, 3), dtype=torch.uint8, generator=g)
        rgba = torch.randint(0, 256, (6, 10, 4), dtype=torch.uint8, generator=g)
        m = torch.randn(5, 3, generator=g)
        c = torch.randn(4, dtype=torch.complex64, generator=g)
        return (hwc.permute(2, 0, 1), rgba[1:5, 2:9].permute(2, 0, 1), m.t(), np.arange(12.0)[::-1] * i,
                torch.arange(3, dtype=torch.int32).expand(4, 3) + i, c.conj())


def test_strided_samples_are_gathered_into_the_slot_as_torch_stack_would(dev):
    ds = Strided()
    with Loader(ds, batch_size=4, workers=2, device=dev) as loader:
        got = [[t.cpu().clone() for t in batch] for batch in loader]
    assert len(got) == 3
    for k, batch in enumerate(got):
        samples = [ds[i] for i in range(4 * k, min(4 * k + 4, len(ds)))]
        for leaf, x in enumerate(batch):
            want = torch.stack([torch.as_tensor(np.ascontiguousarray(s[leaf])) if isinstance(s[leaf], np.ndarray)
                                else s[leaf].resolve_conj() for s in samples])
            assert x.dtype == want.dtype and torch.equal(x, want), (k, leaf)


def labels_of(loader):
    return [y.tolist() for _, y in loader]


def test_batches_come_in_order_with_a_short_last_one_or_none_with_drop_last(dev):
    with Loader(Numbers(), batch_size=8, workers=3, device=dev) as loader:
        assert len(loader) == 5
        got = []
        for x, y in loader:
            assert x.device.type == y.device.type == dev
            assert x.dtype == torch.uint8 and x.shape == (len(y), 3, 4) and y.dtype == torch.int64
            assert torch.equal(x[:, 0, 0].long(), y % 251)
            got.append(y.tolist())
        assert got == [list(range(i, min(i + 8, 37))) for i in range(0, 37, 8)]
    with Loader(Numbers(), batch_size=8, workers=2, drop_last=True, device=dev) as loader:
        assert len(loader) == 4
        assert labels_of(loader) == [list(range(i, i + 8)) for i in range(0, 32, 8)]


def test_shuffled_epochs_are_permutations_reproducible_by_seed_and_set_epoch():
    with Loader(Numbers(), batch_size=6, workers=2, shuffle=True, seed=7, device="cpu") as a, \
            Loader(Numbers(), batch_size=5, workers=3, shuffle=True, seed=7, device="cpu") as b:
        e0, e1 = sum(labels_of(a), []), sum(labels_of(a), [])
        assert sorted(e0) == sorted(e1) == list(range(37)) and e0 != e1
        assert sum(labels_of(b), []) == e0  # the same seed and epoch: the same order, whatever the batching
        a.set_epoch(0)
        assert sum(labels_of(a), []) == e0
        assert sum(labels_of(a), []) == e1  # epochs count on from the one set


def test_ranks_split_the_epoch_padded_to_a_multiple_of_the_world_size():
    shards = []
    for rank in range(3):
        with Loader(Numbers(10), batch_size=2, workers=1, shuffle=True, seed=1, rank=rank, world_size=3,
                       device="cpu") as loader:
            assert len(loader) == 2
            shards.append(sum(labels_of(loader), []))
    assert [len(s) for s in shards] == [4, 4, 4]
    everything = sum(shards, [])
    assert set(everything) == set(range(10)) and len(everything) == 12  # 2 samples repeated as padding
    with pytest.raises(ValueError, match="rank=3"):
        Loader(Numbers(), batch_size=2, rank=3, world_size=3, device="cpu")


def test_sample_seeds_make_the_bytes_independent_of_workers_chunks_and_start_method(dev):
    def run(workers, chunk, method=None):
        with Loader(Random(), batch_size=7, workers=workers, chunk=chunk, shuffle=True, seed=5, device=dev,
                       start_method=method) as loader:
            return [[t.cpu().clone() for t in batch] for batch in loader]
    one = run(1, 7)
    for other in (run(3, 1), run(2, 3, "spawn")):
        assert len(other) == len(one)
        for a, b in zip(one, other):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(one[0][0][0], one[0][0][1])  # samples differ from each other


def test_structures_batch_leaf_by_leaf_with_numbers_as_tensors(dev):
    with Loader(Structured(), batch_size=4, workers=2, device=dev) as loader:
        batch = next(iter(loader))
        batch = {k: (type(v)(*(t.cpu() for t in v)) if isinstance(v, Pair) else v.cpu()) for k, v in batch.items()}
    assert set(batch) == {"pair", "mask", "weight", "id"} and isinstance(batch["pair"], Pair)
    assert batch["pair"].image.shape == (4, 2, 2) and batch["pair"].image.dtype == torch.float32
    assert batch["pair"].label.tolist() == [0, 1, 2, 3]
    assert batch["mask"].dtype == torch.bool and batch["mask"].tolist() == [[True, True], [False, True]] * 2
    assert batch["weight"].dtype == torch.float64 and batch["weight"].tolist() == [0, 0.5, 1, 1.5]
    assert batch["id"].dtype == torch.int16


def test_workers_run_worker_init_fn_and_tell_the_dataset_where_it_runs():
    assert ft.worker_info() is None  # not in a worker
    with Loader(WhereMade(), batch_size=4, workers=3, seed=4, worker_init_fn=init_worker, device="cpu") as loader:
        kept = [tuple(t.clone() for t in batch) for batch in loader]  # a batch lives depth - 1 more next()s
        ids, counts, seeded, ran, index = (torch.cat(parts) for parts in zip(*kept))
    assert index.tolist() == list(range(12))
    assert set(ids.tolist()) <= {0, 1, 2} and counts.tolist() == [3] * 12 and seeded.all()
    assert torch.equal(ran, ids)  # each worker ran worker_init_fn(its id) before its samples


def test_a_later_loaders_workers_hold_nothing_of_an_earlier_ones_memory():
    a = Loader(Numbers(), batch_size=4, workers=1, device="cpu")
    try:
        next(iter(a))  # a's slots are made and mapped here
        with Loader(Numbers(), batch_size=4, workers=1, device="cpu") as b:  # forked after
            next(iter(b))
            pid = b.stats()["workers"][0]["pid"]
            held = {os.stat(f"/proc/{pid}/fd/{x}").st_ino for x in os.listdir(f"/proc/{pid}/fd")
                    if "ferry-loader" in os.readlink(f"/proc/{pid}/fd/{x}")}
            with open(f"/proc/{pid}/maps") as f:
                mapped = {int(line.split()[4]) for line in f if "ferry-loader" in line}
            assert len(held) == 1 and held == mapped, (held, mapped)  # b's slots only
    finally:
        a.close()


def refuse_worker_2(wid):
    if wid == 2:
        raise OSError(f"no scratch directory for worker {wid}")


class SlowFirst(Numbers):
    """Numbers whose first sample takes 0.5 s: a worker that fails at start has exited before the main
    process sends it anything."""

    def __getitem__(self, i):
        if i == 0:
            time.sleep(0.5)
        return super().__getitem__(i)


class StuckAt(Numbers):
    """Numbers whose sample 13 never comes (a dataset stuck on a lock or a dead mount)."""

    def __getitem__(self, i):
        if i == 13:
            time.sleep(3600)
        return super().__getitem__(i)


def test_asking_a_worker_that_does_not_catch_sigusr1_for_its_stack_leaves_it_alive():
    """A worker still starting (faulthandler not yet registered) would die of SIGUSR1's default action:
    the timeout's diagnostic gives its state and sends nothing."""
    from ferry.torch._loader import _ask_for_stack
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.2)
        assert _ask_for_stack(p.pid).endswith(", still starting: no stack")
        time.sleep(0.2)
        assert p.poll() is None, f"the process died of the signal: {p.returncode}"
    finally:
        p.kill()
        p.wait()
    assert _ask_for_stack(p.pid) == "gone"


def test_a_stuck_sample_times_out_naming_the_worker_that_holds_it_with_its_stack(capfd):
    with Loader(StuckAt(), batch_size=8, workers=2, device="cpu", timeout=2) as loader:
        it = iter(loader)
        assert next(it)[1].tolist() == list(range(8))
        # Sample 13 is position 5 of batch 1, in the chunk 4-5; the chunk 6-7 may be waiting behind it.
        with pytest.raises(RuntimeError, match=r"batch 1 of epoch 0 was not made within timeout=2.0 s \([24] samples left; .*"
                                               r"worker \d \(pid \d+, state S, its Python stack on stderr\) holds "
                                               r"positions 4-5"):
            next(it)
    assert "in __getitem__" in capfd.readouterr().err  # the stuck worker's stack, from its own stderr


@pytest.mark.parametrize("dataset", [Numbers, SlowFirst])
def test_a_worker_init_fn_that_raises_is_raised_by_next_with_its_traceback_and_the_loader_closes(dataset):
    loader = Loader(dataset(), batch_size=4, workers=3, worker_init_fn=refuse_worker_2, device="cpu")
    with pytest.raises(OSError, match=r"(?s)no scratch directory for worker 2.*worker_init_fn\(2\).*"
                                      r"traceback.*refuse_worker_2"):
        list(loader)
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_a_batch_is_written_once_by_the_workers_and_never_copied_on_the_host(dev):
    ds = Views()
    with Loader(ds, batch_size=8, workers=3, device=dev) as loader:
        for k, x in enumerate(loader):
            assert torch.equal(x.cpu(), torch.from_numpy(ds.data[8 * k:8 * k + 8].copy()))
        if dev == "cuda":  # the shared slots were registered: the driver sees pinned memory
            assert torch.frombuffer(loader._anchor, dtype=torch.uint8).is_pinned()
    stats = loader.stats()
    assert sum(w["bytes"] for w in stats["workers"]) == ds.data.nbytes  # every sample byte written once
    assert sum(w["samples"] for w in stats["workers"]) == 24
    # The write is a part of each chunk's time (a structural bound, not a speed).
    assert all(0 <= w["write_seconds"] <= w["seconds"] for w in stats["workers"])
    # The one copy after the workers' write: each slot, as it is, to the device.
    assert stats["prefetch"]["batches"] == 3 and stats["prefetch"]["bytes"] == 3 * stats["slot_bytes"]


def test_a_sample_of_another_shape_or_dtype_is_refused_with_its_index():
    for how, text in (("shape", "uint8[3, 5]; the first sample's was uint8[3, 4]"),
                      ("dtype", "int32[3, 4]; the first sample's was uint8[3, 4]")):
        with Loader(Fails(at=13, how=how), batch_size=4, workers=2, device="cpu") as loader:
            it = iter(loader)
            assert [next(it)[1].tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
            with pytest.raises(ValueError, match="sample 13") as e:
                next(it)
            assert text in str(e.value) and "pad them to one shape" in str(e.value)


def test_a_dataset_exception_is_raised_at_its_batch_with_the_index_and_the_workers_traceback():
    with Loader(Fails(at=9), batch_size=4, workers=2, device="cpu") as loader:
        it = iter(loader)
        assert next(it)[1].tolist() == [0, 1, 2, 3]
        assert next(it)[1].tolist() == [4, 5, 6, 7]
        with pytest.raises(KeyError) as e:
            next(it)
        text = str(e.value)
        assert "no sample 9 here" in text and "at sample 9" in text and "batch 2 of epoch 0" in text
        assert "Traceback" in text and "__getitem__" in text
        with pytest.raises(StopIteration):
            next(it)  # the epoch ended with it
        again = iter(loader)  # the next epoch runs, up to the same sample
        assert [next(again)[1].tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        with pytest.raises(KeyError, match="epoch 1"):
            next(again)


def test_a_worker_killed_fails_the_loader_at_once_naming_it():
    with Loader(Fails(at=17, how="kill"), batch_size=4, workers=3, device="cpu", timeout=30) as loader:
        it = iter(loader)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker \d \(pid \d+\) was killed by signal SIGKILL") as e:
            for _ in it:
                pass
        assert time.monotonic() - start < 10  # not the 30 s timeout
        assert "the loader is closed" in str(e.value)
        with pytest.raises(RuntimeError, match="failed earlier"):
            iter(loader)


def test_break_del_close_and_reuse_after_close():
    loader = Loader(Numbers(), batch_size=4, workers=2, device="cpu")
    for i, (x, y) in enumerate(loader):
        if i == 2:
            break
    assert labels_of(loader)[0] == [0, 1, 2, 3]  # a new epoch after an abandoned one
    pids = [w["pid"] for w in loader.stats()["workers"]]
    del loader
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    loader = Loader(Numbers(), batch_size=4, workers=2, device="cpu")
    loader.close()
    loader.close()
    with pytest.raises(ft.ClosedError if hasattr(ft, "ClosedError") else RuntimeError, match="closed"):
        iter(loader)


def test_a_batch_refused_for_a_kept_slot_leaves_the_loader_in_step():
    with Loader(Numbers(), batch_size=8, workers=2, device="cpu") as loader:
        kept = []
        with pytest.raises(RuntimeError, match="still alive"):
            for batch in loader:
                kept.append(batch)  # keeps every batch: the third has no device slot to go to
        assert [y.tolist() for _, y in kept] == [list(range(8)), list(range(8, 16))]
        del kept, batch
        assert labels_of(loader) == [list(range(i, min(i + 8, 37))) for i in range(0, 37, 8)]


class _Finalized:
    """Garbage (a cycle) whose finalizer records the process that ran it."""

    def __init__(self, path):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


class _Collecting(Numbers):
    def __getitem__(self, i):
        gc.collect()  # as the interpreter may, at any allocation
        return super().__getitem__(i)


def test_a_worker_runs_no_finalizer_of_what_it_inherited(tmp_path):
    """A forked worker holds a copy of the parent's garbage: its finalizers (a ferry batch's, a CUDA
    object's) must not run there, where a lock held by one of the parent's threads at the fork would
    stay held forever."""
    record = tmp_path / "finalized"
    gc.disable()  # the garbage is still there when the workers are forked
    try:
        _Finalized(str(record))
        loader = Loader(_Collecting(8), batch_size=4, workers=2, device="cpu")
    finally:
        gc.enable()
    with loader:
        assert labels_of(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    gc.collect()
    assert record.read_text().split() == [str(os.getpid())]  # collected here only


def test_a_fork_childs_copy_of_the_mapping_unmaps_nothing_of_the_childs():
    """The slots are not mapped in a fork child (MADV_DONTFORK): a copy of the mapping object collected
    there (a DataLoader's worker forked while a Loader was garbage) must leave that address range alone,
    which may hold the child's own memory."""
    import ctypes
    import mmap
    with Loader(Numbers(8), batch_size=4, workers=1, device="cpu") as loader:
        assert labels_of(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]
        mapping = loader._mm
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the alarm kills (whatever pytest set)
                signal.alarm(30)
                libc = ctypes.CDLL(None, use_errno=True)
                libc.mmap.restype = ctypes.c_void_p
                libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_long]
                # The child's own memory where the parent's slots are (free here: not inherited).
                mine = libc.mmap(mapping.address, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE,
                                 mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x100000, -1, 0)  # MAP_FIXED_NOREPLACE
                code = 4 if mine != mapping.address else 5
                if code == 5:
                    mapping.close()  # as its finalizer would, in a garbage collection here
                    with open("/proc/self/maps") as f:  # (the kernel may merge it with a neighbour)
                        ranges = [[int(x, 16) for x in line.split()[0].split("-")] for line in f]
                    mapped = any(lo <= mine < hi for lo, hi in ranges)
                    code = 0 if mapped else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert loader._mm is mapping and mapping.address  # the parent's mapping is untouched


DEFAULT_METHOD = textwrap.dedent('''
    import sys, threading, torch
    sys.path.insert(0, sys.argv[1])
    import ferry.torch as ft
    class Two:
        def __len__(self): return 2
        def __getitem__(self, i): return torch.tensor(i)
    if __name__ == "__main__":  # a forkserver's workers import this file as a module
        with ft.Loader(Two(), batch_size=2, workers=1, device="cpu") as a:
            one = a.start_method
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        with ft.Loader(Two(), batch_size=2, workers=1, device="cpu") as b:
            print(one, b.start_method, next(iter(b)).tolist())
''')


def test_workers_are_forked_only_where_no_other_python_thread_runs(tmp_path):
    script = tmp_path / "default_method.py"
    script.write_text(DEFAULT_METHOD)
    r = subprocess.run([sys.executable, str(script), str(ROOT / "python")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["fork", "forkserver", "[0,", "1]"]


def test_bad_arguments_are_refused_naming_the_value():
    for kwargs, text in (({"batch_size": 0}, "batch_size=0"), ({"batch_size": 2, "workers": 0}, "workers=0"),
                         ({"batch_size": 2, "depth": 1}, "depth=1"),
                         ({"batch_size": 2, "start_method": "nope"}, "start_method='nope'")):
        with pytest.raises(ValueError, match=text):
            Loader(Numbers(), device="cpu", **kwargs)
    with pytest.raises(TypeError, match="no __len__ and __getitem__"):
        Loader(iter(range(3)), batch_size=2, device="cpu")


SCRIPT = textwrap.dedent('''
    import os, sys, time, torch
    sys.path.insert(0, sys.argv[1])
    import ferry.torch as ft
    class Slow:
        def __len__(self): return 10**6
        def __getitem__(self, i):
            time.sleep(0.01)
            return torch.zeros(4), i
    if __name__ == "__main__":  # as a forkserver's workers would import this file
        loader = ft.Loader(Slow(), batch_size=4, workers=2, device="cpu")
        print(" ".join(str(w["pid"]) for w in loader.stats()["workers"]), flush=True)
        for batch in loader:
            print("batch", flush=True)
''')


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_or_a_killed_parent_leaves_no_worker_behind(sig, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH")) if p))
    script = tmp_path / "slow.py"
    script.write_text(SCRIPT)
    p = subprocess.Popen([sys.executable, str(script), str(ROOT / "python")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 2
        line = p.stdout.readline().strip()
        if line != "batch":
            p.kill()
            pytest.fail(f"no batch: {line!r}; stderr: {p.communicate(timeout=20)[1][-2000:]}")
        p.send_signal(sig)
        _, err = p.communicate(timeout=20)
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in err and p.returncode != 0
        deadline = time.monotonic() + 2
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [q for q in pids if os.path.exists(f"/proc/{q}")
                     and open(f"/proc/{q}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
            time.sleep(0.02)
        assert alive == [], f"workers {alive} outlived their parent"
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()  # reaps it and closes its pipes
