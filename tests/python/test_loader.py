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
import warnings
from collections import namedtuple
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
import ferry.torch as ft  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(ft.__file__).resolve().parents[2]  # the folder of the ferry package under test


Loader = ft.Loader  # its workers are forked (the default on Linux, also in pytest's threaded process)
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
            if self.how == "exit3":
                os._exit(3)
            if self.how == "segv":
                import ctypes
                ctypes.string_at(0)  # a crash in native code
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
    from ferry._loader.processes import ask_for_stack as _ask_for_stack
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
            import ctypes
            slots = (ctypes.c_char * loader._mm.size).from_address(loader._mm.address)
            assert torch.frombuffer(slots, dtype=torch.uint8).is_pinned()
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


@pytest.mark.parametrize("how, ended, hint", [
    ("kill", "was killed by signal SIGKILL", "out-of-memory killer"),
    ("exit3", "exited with status 3", "its error, if any, is on stderr"),
    ("segv", "was killed by signal SIGSEGV", "a crash, in native code the dataset ran: the worker's Python stack")])
def test_a_worker_that_dies_fails_the_loader_at_once_naming_how_it_ended(how, ended, hint, capfd):
    """The out-of-memory hint only for SIGKILL; another signal or an exit status is named as it is."""
    with Loader(Fails(at=17, how=how), batch_size=4, workers=3, device="cpu", timeout=30) as loader:
        it = iter(loader)
        with pytest.raises(RuntimeError, match=r"worker \d \(pid \d+\) " + ended) as e:
            for _ in it:
                pass
        assert "the loader is closed" in str(e.value) and hint in str(e.value)
        assert ("out-of-memory" in str(e.value)) == (how == "kill"), str(e.value)
        assert "while starting" not in str(e.value)
        with pytest.raises(RuntimeError, match="failed earlier"):
            iter(loader)
    if how == "segv":  # faulthandler's stack, from the worker's own stderr
        assert "Fatal Python error: Segmentation fault" in capfd.readouterr().err


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


# No `if __name__ == "__main__":`, a Dataset in `python -c`'s __main__ and another Python thread running (a
# TensorBoard writer's, a logging listener's, a Jupyter kernel's): what DataLoader users run on Linux.
THREADED_MAIN = textwrap.dedent('''
    import sys, threading, torch
    sys.path.insert(0, sys.argv[1])
    import ferry.torch as ft
    class D:
        def __len__(self): return 4
        def __getitem__(self, i): return torch.full((2,), i), i
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    print("main body", flush=True)
    try:
        with ft.Loader(D(), batch_size=2, workers=2, device="cpu", start_method=sys.argv[2] or None) as a:
            print(a.start_method, [y.tolist() for _, y in a])
    except RuntimeError as e:
        print("error:", e)
''')


def test_workers_are_forked_by_default_also_while_another_python_thread_runs():
    r = subprocess.run([sys.executable, "-c", THREADED_MAIN, str(PACKAGE), ""], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["main body", "fork [[0, 1], [2, 3]]"], r.stdout + r.stderr


def test_a_worker_that_cannot_start_says_what_to_do():
    """Under forkserver the worker cannot unpickle a Dataset of `python -c`'s __main__: the error names the
    main guard, an importable module and start_method='fork', not the out-of-memory killer."""
    r = subprocess.run([sys.executable, "-c", THREADED_MAIN, str(PACKAGE), "forkserver"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "main body" and out[1].startswith("error: ferry Loader worker "), r.stdout + r.stderr
    assert "exited with status 1 while starting" in out[1]
    for text in ("start_method='forkserver'", "if __name__ == \"__main__\":", "importable module",
                 "start_method='fork'"):
        assert text in out[1], out[1]
    assert "out-of-memory" not in out[1]
    assert "Can't get attribute 'D'" in r.stderr  # the worker's own error


def test_a_dataset_that_cannot_be_pickled_to_spawned_workers_says_what_to_do():
    class Local(Numbers):  # defined in a function: pickle cannot name it
        pass
    with pytest.raises(RuntimeError, match=r"worker 0 of 2 could not be started \(\w+Error: .*Local.*\): "
                                           r"under start_method='spawn' the dataset.*importable module.*"
                                           r"start_method='fork'"):
        Loader(Local(), batch_size=2, workers=2, device="cpu", start_method="spawn")


def test_a_loader_made_while_a_spawned_worker_imports_the_main_module_names_the_main_guard(monkeypatch):
    """A script without `if __name__ == "__main__":` under spawn runs its body again in each worker, which
    makes a Loader there: multiprocessing marks such a process (_inheriting) and refuses to start one."""
    import multiprocessing
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match=r"imports the main module again.*outside `if __name__ == \"__main__\":`"):
        Loader(Numbers(), batch_size=2, workers=1, device="cpu", start_method="spawn")


def test_the_default_start_method_is_the_one_the_program_set_as_for_a_dataloader(monkeypatch):
    """multiprocessing.set_start_method("spawn") (common in CUDA scripts) makes a DataLoader without
    multiprocessing_context spawn: a Loader's start_method=None follows it too; one asked for wins."""
    import multiprocessing
    from ferry._loader import processes as _loader
    context = multiprocessing.context._default_context
    monkeypatch.setattr(context, "_actual_context", context._actual_context)  # the global choice, restored after
    multiprocessing.set_start_method("spawn", force=True)
    assert _loader.start_method(None) == "spawn"
    assert _loader.start_method("fork") == "fork"
    multiprocessing.set_start_method("forkserver", force=True)
    assert _loader.start_method(None) == "forkserver"


def test_where_fork_is_unsafe_the_default_spawns_and_says_so_once_and_workers_0_says_nothing(monkeypatch):
    from ferry._loader import processes as _loader
    # Python's default, which no_leaks's forkserver fixed as multiprocessing's: not the program's choice.
    assert _loader.start_method(None) == "fork"
    monkeypatch.setattr(_loader.sys, "platform", "darwin")
    monkeypatch.setattr(_loader, "_warned_start_method", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Loader(Numbers(4), batch_size=2, workers=0, device="cpu").close()  # no worker: no start method to warn of
    with pytest.warns(RuntimeWarning, match=r"workers start with 'spawn', not 'fork' \(macOS.*importable module.*"
                                            r"if __name__ == \"__main__\":.*start_method="):
        assert _loader.start_method(None) == "spawn"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _loader.start_method(None) == "spawn"  # said once
        assert _loader.start_method("fork") == "fork"  # chosen: nothing to say


def test_a_spawned_worker_held_in_the_main_modules_import_is_named_with_the_main_guard_at_the_timeout(tmp_path):
    """A script with a top-level torch.distributed.init_process_group() and no main guard, under spawn: each
    worker imports it again and waits there for ever, never reaching _start_workers's check of the main
    guard. Here the worker waits in a module it imports to unpickle the dataset; the timeout says why."""
    (tmp_path / "waits_in_a_worker.py").write_text(textwrap.dedent(f'''
        import os, time
        if os.getpid() != {os.getpid()}:  # in a worker: as init_process_group() waits for ranks that never come
            time.sleep(60)
        class Data:
            def __len__(self): return 4
            def __getitem__(self, i): return i
    '''))
    sys.path.insert(0, str(tmp_path))  # spawn hands the path to the worker
    try:
        import waits_in_a_worker
        with Loader(waits_in_a_worker.Data(), batch_size=2, workers=1, device="cpu", start_method="spawn",
                    timeout=1) as loader:
            with pytest.raises(RuntimeError, match=r"worker 0 \(pid \d+, [^)]*\) made no sample 0 within timeout=1.0 "
                                                   r"s; worker 0 never started: under start_method='spawn' a worker "
                                                   r"first imports the main module again.*init_process_group.*"
                                                   r"if __name__ == \"__main__\":.*larger timeout="):
                next(iter(loader))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("waits_in_a_worker", None)


def test_bad_arguments_are_refused_naming_the_value():
    for kwargs, text in (({"batch_size": 0}, "batch_size=0"),
                         ({"batch_size": 2, "workers": -1}, r"workers=-1\): expected an integer >= 0 \(0: the samples"),
                         ({"batch_size": 2, "num_workers": -1}, r"num_workers=-1\): expected an integer >= 0"),
                         ({"batch_size": 2, "workers": 2, "num_workers": 2}, r"workers=2, num_workers=2\): give one"),
                         ({"batch_size": 2, "depth": 1}, "depth=1"),
                         ({"batch_size": 2, "start_method": "nope"}, "start_method='nope'"),
                         ({"batch_size": 2, "workers": 0, "start_method": "nope"}, "start_method='nope'"),
                         ({"batch_size": 2, "sampler": range(3), "shuffle": True},
                          "sampler is mutually exclusive with shuffle"),
                         ({"batch_size": 2, "sampler": range(3), "rank": 0, "world_size": 2},
                          r"give the rank and world size to it \(DistributedSampler")):
        with pytest.raises(ValueError, match=text):
            Loader(Numbers(), device="cpu", **kwargs)
    with pytest.raises(TypeError, match="no __len__ and __getitem__"):
        Loader(iter(range(3)), batch_size=2, device="cpu")
    with pytest.raises(TypeError, match="sampler=a int.*not iterable"):
        Loader(Numbers(), batch_size=2, sampler=3, device="cpu")

    class Stream(torch.utils.data.IterableDataset):  # has __getitem__ (Dataset's, which raises) and __len__
        def __iter__(self):
            return iter(range(3))

        def __len__(self):
            return 3
    with pytest.raises(TypeError, match="a Stream is an IterableDataset.*DataLoader and ferry.torch.Prefetcher"):
        Loader(Stream(), batch_size=2, device="cpu")


def test_construction_arguments_are_attributes_that_cannot_be_changed_later():
    with Loader(Numbers(8), batch_size=4, num_workers=1, drop_last=True, device="cpu") as loader:
        assert (loader.batch_size, loader.drop_last, loader.sampler, loader.workers, loader.num_workers) == \
            (4, True, None, 1, 1)
        assert isinstance(loader.dataset, Numbers)
        for name in ("batch_size", "sampler", "drop_last", "dataset", "shuffle", "workers"):
            with pytest.raises(ValueError, match=rf"Loader.{name} cannot be changed once the Loader is made"):
                setattr(loader, name, 2)
        assert loader.batch_size == 4 and labels_of(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]


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


class Tagged(list):
    pass


class Shapes:
    """Sample i in each structure a Dataset returns: a tuple, a list subclass, a namedtuple, a dict."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 6

    def __getitem__(self, i):
        x, y = torch.full((2,), i, dtype=torch.int32), i
        return {"tuple": (x, y), "list": Tagged([x, y]), "namedtuple": Pair(x, y), "dict": {"x": x, "y": y}}[self.kind]


@pytest.mark.parametrize("kind, batch_type", [("tuple", list), ("list", Tagged), ("namedtuple", Pair), ("dict", dict)])
def test_a_batch_has_the_structure_default_collate_gives_it(kind, batch_type):
    """default_collate makes a list of a tuple sample (code assigns into the batch), keeps a list's,
    namedtuple's and dict's type: so does the Loader."""
    from torch.utils.data import DataLoader
    want = next(iter(DataLoader(Shapes(kind), batch_size=3)))
    with Loader(Shapes(kind), batch_size=3, workers=1, device="cpu") as loader:
        got = next(iter(loader))
        assert type(got) is type(want) is batch_type
        values = got.values() if kind == "dict" else got
        assert [t.tolist() for t in values] == [[[0, 0], [1, 1], [2, 2]], [0, 1, 2]]
        if kind in ("tuple", "list"):
            got[0] = got[0].float()  # a list: assignable, as a DataLoader's batch


def test_a_sampler_gives_each_epochs_order_and_set_epoch_reaches_it():
    from torch.utils.data.distributed import DistributedSampler
    ds = Numbers(10)
    shards = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        with Loader(ds, batch_size=2, workers=1, sampler=sampler, device="cpu") as loader:
            assert loader.sampler is sampler and len(loader) == 3
            loader.set_epoch(1)
            assert sampler.epoch == 1  # the Loader's set_epoch is the sampler's too
            shards.append(sum(labels_of(loader), []))
            assert shards[-1] == list(sampler)  # epoch 1's order, the sampler's
    assert sorted(shards[0] + shards[1]) == list(range(10))
    with Loader(ds, batch_size=4, workers=1, sampler=[3, 1, 4, 1, 5], device="cpu") as loader:
        assert len(loader) == 2 and labels_of(loader) == [[3, 1, 4, 1], [5]]
    with Loader(ds, batch_size=4, workers=1, sampler=[2, 10], device="cpu") as loader:
        with pytest.raises(ValueError, match="the sampler gave index 10 at position 1; the dataset has 10 samples"):
            iter(loader)
    with Loader(ds, batch_size=4, workers=0, sampler=[-10, -11], device="cpu") as loader:  # -10: sample 0
        with pytest.raises(ValueError, match=r"the sampler gave index -11 at position 1; the dataset has 10 samples "
                                             r"\(indices 0 to 9, or -10 to -1 from the end\)"):
            iter(loader)
    with Loader(ds, batch_size=4, workers=1, sampler=iter([1, 2]), device="cpu") as loader:
        with pytest.raises(TypeError, match="sampler without len"):
            len(loader)


class MainOrWorker(Random):
    """Random's draws, and what the sample sees of where it runs."""

    def __getitem__(self, i):
        a, b, c, d = super().__getitem__(i)
        return a, b, c, d, ft.worker_info() is None, torch.utils.data.get_worker_info() is None


def test_workers_0_makes_the_same_bytes_in_this_process_and_keeps_its_random_state():
    def run(**kwargs):
        with Loader(MainOrWorker(), batch_size=7, shuffle=True, seed=5, device="cpu", **kwargs) as loader:
            assert len(loader.stats()["workers"]) == loader.workers
            return [[t.clone() for t in batch] for batch in loader]
    import random
    torch.manual_seed(11), np.random.seed(11), random.seed(11)
    want = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(11), np.random.seed(11), random.seed(11)
    kids = children()
    here = run(workers=0)
    assert children() == kids  # no process started
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]
    again = run(num_workers=0)
    there = run(workers=2)
    assert len(here) == len(there) == 6
    for a, b, c in zip(here, there, again):
        assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4]))
        assert all(torch.equal(x, y) for x, y in zip(a, c))
        assert a[4].all() and a[5].all()  # in this process: worker_info() and get_worker_info() are None
        assert not b[4].any() and not b[5].any()  # in a worker: both answer


def test_workers_0_raises_the_datasets_own_exception_naming_the_sample():
    with Loader(Fails(at=9), batch_size=4, workers=0, device="cpu") as loader:
        it = iter(loader)
        assert [next(it)[1].tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        with pytest.raises(KeyError) as e:
            next(it)
        assert e.value.args == ("no sample 9 here",)  # the dataset's exception itself
        assert "__getitem__" in str(e.traceback[-1].name)
        if sys.version_info >= (3, 11):
            assert "raised at sample 9 (batch 2 of epoch 0, position 1) in this process" in e.value.__notes__[0]
        with pytest.raises(StopIteration):
            next(it)  # the epoch ended with it
        again = iter(loader)
        assert next(again)[1].tolist() == [0, 1, 2, 3]  # the next epoch runs
    with Loader(Fails(at=0), batch_size=4, workers=0, device="cpu") as loader:
        with pytest.raises(KeyError, match="no sample 0 here"):
            iter(loader)  # the first sample sizes the slots
        with pytest.raises(KeyError):
            iter(loader)  # still usable: asked again


class TorchWorkerInfo:
    """What torch.utils.data.get_worker_info() says in the worker, beside ferry's worker_info()."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info, mine = torch.utils.data.get_worker_info(), ft.worker_info()
        return (info.id, info.num_workers, info.seed & 0xFFFFFFFF, info.dataset is mine.dataset, mine.id,
                mine.seed == torch.initial_seed(), _INIT.get("torch_seed", 0) & 0xFFFFFFFF)


def record_torch_seed(wid):
    info = torch.utils.data.get_worker_info()
    assert info.id == wid and info.seed == torch.initial_seed() == ft.worker_info().seed
    _INIT["torch_seed"] = info.seed


def test_torch_get_worker_info_answers_in_a_worker_with_the_workers_own_seed():
    assert torch.utils.data.get_worker_info() is None
    with Loader(TorchWorkerInfo(), batch_size=2, workers=3, worker_init_fn=record_torch_seed, device="cpu") as loader:
        rows = torch.cat([torch.stack([t.clone() for t in batch], 1) for batch in loader]).tolist()
    assert torch.utils.data.get_worker_info() is None  # never set in this process
    seeds = {}
    for wid, count, seed, same_dataset, mine, sample_seeded, init_seed in rows:
        assert wid == mine and count == 3 and same_dataset and sample_seeded
        assert seeds.setdefault(wid, seed) == seed == init_seed  # fixed for the worker's life
    assert len(set(seeds.values())) == len(seeds) >= 2  # one per worker
