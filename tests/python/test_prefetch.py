"""ferry.torch.Prefetcher: structures and values, a DataLoader, the lifetime rule, errors, fork."""
import collections
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import ferry
from ferry.torch import Prefetcher

Pair = collections.namedtuple("Pair", ["image", "label"])
ROOT = Path(__file__).resolve().parents[2]


def batches(n, seed=0, last=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        rows = last if (last is not None and i == n - 1) else 8
        out.append((torch.randn(rows, 3, 5, 5, generator=g), torch.randint(0, 10, (rows,), generator=g), f"b{i}"))
    return out


def on_host(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def test_tuples_arrive_intact_in_order_with_a_short_last_batch(device, backend):
    src = batches(9, last=3)
    got = []
    for image, label, name in Prefetcher(src, depth=2, device=device, workers=3, slots=2):
        assert image.device.type == ("cuda" if backend == "cuda" else "cpu")
        got.append((image.cpu().clone(), label.cpu().clone(), name))  # a copy: the batch itself is lent
    assert len(got) == 9
    for (i0, l0, n0), (i1, l1, n1) in zip(src, got):
        assert torch.equal(i0, i1) and torch.equal(l0, l1) and n0 == n1 and i1.dtype == i0.dtype


def test_dicts_namedtuples_and_plain_tensors_keep_their_structure(device):
    src = [{"x": torch.arange(12, dtype=torch.float64).reshape(3, 4) + k, "pair": Pair(torch.ones(2) * k, k),
            "raw": torch.full((5,), k, dtype=torch.uint8)} for k in range(4)]
    for k, b in enumerate(Prefetcher(src, device=device)):
        assert set(b) == {"x", "pair", "raw"} and isinstance(b["pair"], Pair)
        assert torch.equal(b["x"].cpu(), src[k]["x"]) and b["pair"].label == k
        assert torch.equal(b["pair"].image.cpu(), src[k]["pair"].image)
        assert torch.equal(b["raw"].cpu(), src[k]["raw"])


class Squares(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((4, 4), float(i)), i


def test_a_dataloader_with_worker_processes_feeds_it(device):
    loader = DataLoader(Squares(), batch_size=8, num_workers=2)
    seen = []
    for x, y in Prefetcher(loader, device=device):
        assert torch.equal(x.cpu()[:, 0, 0], y.cpu().to(torch.float32))
        seen += y.cpu().tolist()
    assert seen == list(range(40))


def test_the_loaders_attributes_are_read_through_the_prefetcher(device):
    """imagenet's distributed validate() reads len(val_loader.sampler) and len(val_loader.dataset); the DDP
    tutorial calls train_data.sampler.set_epoch(epoch): on a wrapped DataLoader too."""
    from torch.utils.data.distributed import DistributedSampler
    ds = Squares()
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=0)
    p = Prefetcher(DataLoader(ds, batch_size=8, sampler=sampler, drop_last=True), device=device)
    assert p.sampler is sampler and p.dataset is ds and p.batch_size == 8 and p.drop_last is True
    assert len(p.sampler) == 20 and len(p.dataset) == 40 and len(p) == 2
    p.sampler.set_epoch(3)
    seen = sum((y.cpu().tolist() for _, y in p), [])
    sampler.set_epoch(3)
    assert seen == list(sampler)[:16]  # the epoch the sampler was set to
    assert p.depth == 2 and p.workers == 4  # the Prefetcher's own attributes come first
    with pytest.raises(AttributeError, match=r"'Prefetcher' object has no attribute 'no_such', nor has its source "
                                             r"\(a DataLoader\)"):
        p.no_such
    with pytest.raises(AttributeError):
        p._iterator  # a DataLoader's private attribute: not forwarded
    p.close()


def test_a_half_made_prefetcher_forwards_nothing_and_does_not_recurse():
    """Before __init__ stored the source (a failed __init__, __del__ then, unpickling) no name is forwarded."""
    import pickle
    half = Prefetcher.__new__(Prefetcher)
    assert not hasattr(half, "sampler") and not hasattr(half, "_source")
    half.__del__()
    copy = pickle.loads(pickle.dumps(half))
    assert not hasattr(copy, "batch_size")
    with pytest.raises(ValueError, match="depth=1"):
        Prefetcher([1], depth=1)  # its __del__ runs on a half-made object


def test_a_batch_keeps_the_structure_its_source_gave(device):
    """A DataLoader's default_collate gives lists (of tuple samples): the Prefetcher yields lists; a
    collate_fn's tuple stays a tuple."""
    listed = next(iter(Prefetcher(DataLoader(Squares(), batch_size=4), device=device)))
    assert type(listed) is list and listed[1].cpu().tolist() == [0, 1, 2, 3]
    tupled = next(iter(Prefetcher(DataLoader(Squares(), batch_size=4, collate_fn=lambda b: tuple(
        torch.utils.data.default_collate(b))), device=device)))
    assert type(tupled) is tuple and tupled[1].cpu().tolist() == [0, 1, 2, 3]


def test_a_batch_kept_past_its_window_raises_naming_it_then_recovers(device):
    src = batches(6)
    it = iter(Prefetcher(src, depth=2, device=device))
    kept = [next(it), next(it)]  # batches 0 and 1 alive; batch 2 goes into batch 0's slot
    with pytest.raises(RuntimeError, match="batch 2 goes into the device slot of batch 0"):
        next(it)
    assert torch.equal(kept[0][0].cpu(), src[0][0])  # not overwritten
    del kept
    rest = [(b[0].cpu().clone(), b[2]) for b in it]
    assert [n for _, n in rest] == ["b2", "b3", "b4", "b5"]
    assert all(torch.equal(x, src[k + 2][0]) for k, (x, _) in enumerate(rest))


def test_bad_input_names_the_value(device):
    with pytest.raises(ValueError, match="depth=1"):
        Prefetcher([], depth=1, device=device)
    with pytest.raises(ValueError, match="oversize='shrink'"):
        Prefetcher([], device=device, oversize="shrink")
    bad = [(torch.zeros(4, 4).t(),)]
    with pytest.raises(ValueError, match=r"batch\[0\] of batch 0 .* is not contiguous"):
        next(Prefetcher(bad, device=device))


def test_end_and_close(device):
    it = Prefetcher(batches(2), device=device)
    assert len(list(it)) == 2
    with pytest.raises(StopIteration):
        next(it)
    it2 = Prefetcher(batches(3), device=device)
    next(it2)
    it2.close()
    with pytest.raises(ferry.ClosedError):
        next(it2)
    with pytest.raises(ferry.ClosedError):
        iter(it2)


def test_every_for_is_a_new_epoch_and_len_is_the_sources(device):
    src = batches(5, last=2)
    p = Prefetcher(src, device=device)
    assert len(p) == 5
    for _ in range(2):  # a second `for` used to yield nothing
        assert [b[2] for b in p] == ["b0", "b1", "b2", "b3", "b4"]
    it = iter(p)
    assert it.__length_hint__() == 5  # what list() and tqdm-like consumers read
    next(it)
    assert it.__length_hint__() == 4
    # A `for` that ends early (its loop variable still holding a batch) leaves the next `for` a whole pass.
    for b in p:
        if b[2] == "b2":
            break
    kept = b
    assert [(x.cpu().clone(), n) for x, _, n in p][0][1] == "b0"
    assert torch.equal(kept[0].cpu(), src[2][0])  # the abandoned pass's batch is still valid
    with pytest.raises(RuntimeError, match="abandoned"):
        next(it)  # the iterator of a pass a newer one replaced
    loader = DataLoader(Squares(), batch_size=16)  # 40 samples: 16, 16 and a smaller last batch of 8
    pl = Prefetcher(loader, device=device)
    assert len(pl) == 3
    for _ in range(2):
        assert [y.cpu().tolist() for _, y in pl] == [list(range(0, 16)), list(range(16, 32)), list(range(32, 40))]


def test_a_one_pass_source_is_refused_a_second_pass_by_name(device):
    p = Prefetcher((b for b in batches(2)), device=device)
    assert len(list(p)) == 2
    with pytest.raises(TypeError, match="generator, an iterator that was used up"):
        iter(p)
    with pytest.raises(TypeError, match="has no len"):
        len(p)
    assert p  # truthy without a len()


def test_a_source_error_surfaces_at_its_batch_after_the_ones_before(device):
    def source():
        yield from batches(3)
        raise OSError("sample 24 cannot be read")

    got = []
    with pytest.raises(OSError, match="sample 24") as info:
        for b in Prefetcher(source(), device=device):  # the lookahead reaches the error before batch 0
            got.append(b[2])
    assert got == ["b0", "b1", "b2"]
    if sys.version_info >= (3, 11):
        assert "at batch 3" in "".join(info.value.__notes__)

    class Broken(Squares):
        def __getitem__(self, i):
            if i == 20:
                raise KeyError(f"no sample {i}")
            return super().__getitem__(i)

    seen = []
    with pytest.raises(KeyError, match="no sample 20"):
        for _, y in Prefetcher(DataLoader(Broken(), batch_size=8), device=device):
            seen += y.cpu().tolist()
    assert seen == list(range(16))  # batches 0 and 1; batch 2 holds sample 20


def test_fields_that_dlpack_refuses_are_converted_or_named(device):
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(4, 6, generator=g) > 0.5
    weights = torch.randn(4, requires_grad=True)
    arr = np.arange(12, dtype=np.int16).reshape(3, 4)
    src = [{"mask": mask, "w": weights, "np": arr, "npbool": arr > 5, "scalar": torch.tensor(True), "k": 7}]
    (b,) = list(Prefetcher(src, device=device))
    assert b["mask"].dtype == torch.bool and torch.equal(b["mask"].cpu(), mask)
    assert not b["w"].requires_grad and torch.equal(b["w"].cpu(), weights.detach())
    assert b["np"].dtype == torch.int16 and torch.equal(b["np"].cpu(), torch.from_numpy(arr))
    assert b["npbool"].dtype == torch.bool and torch.equal(b["npbool"].cpu(), torch.from_numpy(arr > 5))
    assert b["scalar"].shape == () and bool(b["scalar"])
    assert b["k"] == 7
    refused = [
        ([torch.ones(2), torch.eye(3).to_sparse()], r"batch\[1\] of batch 0 is a torch.sparse_coo tensor"),
        ({"names": np.array(["a", None], dtype=object)},
         r"batch\['names'\] of batch 0 is a numpy array of dtype object"),
        ({"mask": torch.ones(4, 4, dtype=torch.bool).t()}, r"batch\['mask'\] of batch 0 .*not contiguous"),
    ]
    for batch, message in refused:
        with pytest.raises(ValueError, match=message):
            next(Prefetcher([batch], device=device))


def test_a_batch_larger_than_the_slots_is_copied_plainly_or_refused(device):
    sizes = [4, 400, 3, 1000]  # slots sized by the first batch (16 bytes)
    src = [torch.arange(n, dtype=torch.float32) for n in sizes]
    with pytest.warns(RuntimeWarning, match="batch 1 needs 1600 bytes.*batch_bytes=1600"):
        got = [t.cpu().clone() for t in Prefetcher(src, device=device)]
    assert [t.numel() for t in got] == sizes and all(torch.equal(a, b) for a, b in zip(got, src))
    strict = Prefetcher(src, device=device, oversize="error")
    assert next(strict).numel() == 4  # the batch before it is yielded first
    with pytest.raises(ValueError, match="batch 1 needs 1600 bytes; ferry's slots hold 16.*batch_bytes="):
        next(strict)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sized for the largest: every batch is prefetched
        assert [t.numel() for t in Prefetcher(src, device=device, batch_bytes=4096)] == sizes


def test_no_error_at_exit_with_a_batch_still_referenced(tmp_path, backend):
    # A script's last batch outlives its prefetcher. Kept in a reference cycle (as training state often
    # is), it is freed by the interpreter's last collection, after the teardown of ferry._device has
    # destroyed the default device's stream the batch is released on; the script does those two steps
    # itself, in that order. It used to print "ignored error ... releasing batch N: ... not a live stream".
    script = f"""
import gc, sys, torch
sys.path.insert(0, {str(ROOT / 'python')!r})
from torch.utils.data import DataLoader, TensorDataset
from ferry import _device
from ferry.torch import Prefetcher
dev = {'"cpu"' if backend == "host" else '"cuda"'}
data = TensorDataset(torch.arange(64.0).reshape(32, 2), torch.arange(32))
for x, y in Prefetcher(DataLoader(data, batch_size=8), device=dev):
    pass
assert float(x[0, 0]) == 48.0
state = {{"last": (x, y)}}
state["self"] = state
del x, y
gc.collect()
_device._default_devices.clear()  # what the interpreter's teardown of ferry._device does
del state
gc.collect()
for x, y in Prefetcher(DataLoader(data, batch_size=8), device=dev):
    pass
kept = Prefetcher(DataLoader(data, batch_size=8), device=dev)  # open at exit: closed by ferry's atexit
for x2, y2 in kept:
    pass
print("done")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
    assert "ignored error" not in r.stderr, r.stderr


def test_a_forked_child_that_exits_normally_closes_nothing_of_the_parents(tmp_path, backend):
    # A child forked while a Prefetcher is open (a user's os.fork, a multiprocessing child that returns
    # through sys.exit) runs ferry's exit hook: the objects are the parent's, and closing them there refused
    # with a ForkedError printed at the child's exit.
    script = f"""
import os, sys, torch
sys.path.insert(0, {str(ROOT / 'python')!r})
from ferry.torch import Prefetcher
dev = {'"cpu"' if backend == "host" else '"cuda"'}
kept = Prefetcher([torch.arange(8.0)] * 4, device=dev)
next(kept)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the interpreter's exit runs the atexit hooks
_, status = os.waitpid(pid, 0)
assert os.WEXITSTATUS(status) == 0, status
print("done")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
    assert "ForkedError" not in r.stderr and "at exit" not in r.stderr, r.stderr


def test_use_in_a_forked_child_raises_a_clear_error(device):
    it = Prefetcher(batches(4), device=device)
    next(it)
    pid = os.fork()
    if pid == 0:
        try:
            next(it)
            code = 1
        except ferry.ForkedError:
            code = 0
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    it.close()


def _in_fork_child(body) -> bytes:
    """Runs body() in an os.fork() child and returns the bytes it returned, once the child exited 0. A child
    that hangs is killed by SIGALRM after 30 s, and the test fails."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.close(read)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(30)
            os.write(write, body())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    answer = os.read(read, 4096)
    os.close(read)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return answer


def test_a_forked_child_that_frees_an_inherited_batch_leaves_it_to_the_parent(device):
    """A fork child (a DataLoader's worker, any multiprocessing child) may free batch tensors it inherited,
    perhaps in a garbage collection. That must not release the batch: the release takes the prefetcher's
    locks, which one of the parent's threads may have held at the fork, and the child would wait forever."""
    from ctypes import byref, c_int, c_uint64

    from ferry._c import lib
    it = Prefetcher(batches(4), device=device)
    held = [next(it)]  # batch 0, lent until its tensors go: held[0] is the only reference
    handle = it._pipeline.handle

    def free_it():
        held.clear()  # the last reference in this child to batch 0's tensors (they hold no cycle)
        out = c_int(-1)
        assert lib.ferry_prefetch_released(handle, c_uint64(0), byref(out)) == 0
        return bytes([out.value & 0xFF])

    assert _in_fork_child(free_it) == b"\x00", "the child's free released the parent's batch 0"
    out = c_int(-1)
    assert lib.ferry_prefetch_released(handle, c_uint64(0), byref(out)) == 0 and out.value == 0  # lent here
    held.clear()
    assert lib.ferry_prefetch_released(handle, c_uint64(0), byref(out)) == 0 and out.value == 1
    it.close()


def test_a_fork_child_cannot_close_or_destroy_the_parents_prefetcher(device):
    """In a fork child (C code of a user's, a child that runs an inherited object's cleanup) closing an
    inherited prefetcher is refused and destroying it leaves the child's copy alone: either would join the
    parent's threads, which do not exist in the child (it hung forever). Every other call on it is refused
    as well (they take locks the parent's threads may have held at the fork). The parent's prefetcher goes
    on."""
    from ferry._c import InvalidArgumentError, lib
    src = batches(4)
    it = Prefetcher(src, device=device)
    first = next(it)
    assert torch.equal(first[0].cpu(), src[0][0])
    del first
    handle = it._pipeline.handle

    def close_and_destroy():
        try:
            lib.ferry_prefetch_close(handle)
            answer = b"closed"
        except InvalidArgumentError as e:
            answer = b"refused" if "made by the parent of this fork child" in str(e) else str(e).encode()
        lib.ferry_prefetch_destroy(handle)
        return answer

    assert _in_fork_child(close_and_destroy) == b"refused"

    def use():  # every other call on the inherited prefetcher is refused too, naming itself
        from ctypes import byref, c_size_t, c_void_p

        from ferry._c import BatchHandle
        calls = {"ferry_prefetch_next": lambda: lib.ferry_prefetch_next(handle, 0, byref(BatchHandle())),
                 "ferry_prefetch_stats_json": lambda: lib.ferry_prefetch_stats_json(handle, byref(c_void_p())),
                 "ferry_prefetch_slot_bytes": lambda: lib.ferry_prefetch_slot_bytes(handle, byref(c_size_t()))}
        out = []
        for name, call in calls.items():
            try:
                call()
                out.append(f"{name}: ran")
            except InvalidArgumentError as e:
                out.append(f"{name}: refused" if name in str(e) and "parent of this fork child" in str(e)
                           else f"{name}: {e}")
        return "; ".join(out).encode()

    assert _in_fork_child(use) == (b"ferry_prefetch_next: refused; ferry_prefetch_stats_json: refused; "
                                   b"ferry_prefetch_slot_bytes: refused")
    for i in range(1, 4):  # the parent's prefetcher still copies the rest of the epoch
        b = next(it)
        assert torch.equal(b[0].cpu(), src[i][0]) and torch.equal(b[1].cpu(), src[i][1])
    with pytest.raises(StopIteration):
        next(it)
    it.close()
