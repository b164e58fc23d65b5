"""ferry.torch.Prefetcher: structures and values, a DataLoader, the lifetime rule, errors, fork."""
import collections
import os

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import ferry
from ferry.torch import Prefetcher

Pair = collections.namedtuple("Pair", ["image", "label"])


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


def test_a_batch_kept_past_its_window_raises_naming_it_then_recovers(device):
    src = batches(6)
    it = Prefetcher(src, depth=2, device=device)
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
    bad = [(torch.zeros(4, 4).t(),)]
    with pytest.raises(ValueError, match=r"batch\[0\] .* is not contiguous"):
        next(Prefetcher(bad, device=device))
    growing = [torch.zeros(4), torch.zeros(400)]
    with pytest.raises(ValueError, match="batch 1 needs 1600 bytes.*batch_bytes"):
        next(Prefetcher(growing, device=device))
    ok = Prefetcher(growing, device=device, batch_bytes=4096)
    assert [t.numel() for t in ok] == [4, 400]


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
