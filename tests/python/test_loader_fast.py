"""ferry.torch.Loader's per-sample fast path (ferry/torch/_samples.py): samples of the first sample's
structure written a chunk at a time, and random's and numpy's lazy seeding. Every batch equals the one the
general path makes (workers=0 seeds every generator before every sample and writes one sample at a time
for a chunk whose samples it does not recognise), refusals keep their index and text wherever the bad
sample falls in a chunk, and a dataset that draws only for some samples gets the same bytes. The no-leak
check of test_loader.py runs after each."""
import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from test_loader import Loader, Pair, no_leaks  # noqa: E402,F401 - no_leaks: autouse fixture


class Everything:
    """Sample i: every kind of leaf the fast path writes (tensor, array, numpy scalar, int, float, bool)
    in a dict, a namedtuple and a tuple, with a strided tensor among them."""

    def __len__(self):
        return 45

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        m = torch.randn(3, 4, generator=g)
        return {"pair": Pair(np.full((2, 2), i, np.float32), i), "t": (m.t(), torch.arange(4, dtype=torch.int16) + i),
                "flag": i % 3 == 0, "w": i / 7, "id": np.int16(i), "big": torch.full((5,), i, dtype=torch.int64)}


def flat(batch):
    if isinstance(batch, torch.Tensor):
        return [batch.cpu().clone()]
    if isinstance(batch, dict):
        return sum((flat(v) for v in batch.values()), [])
    return sum((flat(v) for v in batch), [])


def run(ds, **kw):
    with Loader(ds, device="cpu", **kw) as loader:
        return [flat(b) for b in loader]


def same(a, b):
    return len(a) == len(b) and all(len(x) == len(y) and all(torch.equal(p, q) and p.dtype == q.dtype
                                                             for p, q in zip(x, y)) for x, y in zip(a, b))


def test_every_leaf_kind_is_written_by_the_fast_path_as_the_general_path_writes_it():
    want = run(Everything(), batch_size=8, workers=0)
    got = run(Everything(), batch_size=8, workers=2, chunk=4)
    assert same(want, got) and len(got) == 6
    # against torch's own stacking of the samples
    ds = Everything()
    first = [ds[i] for i in range(8)]
    assert torch.equal(got[0][2], torch.stack([s["t"][0] for s in first]))
    assert got[0][4].dtype == torch.bool and got[0][4].tolist() == [i % 3 == 0 for i in range(8)]
    assert got[0][5].dtype == torch.float64 and got[0][5].tolist() == [i / 7 for i in range(8)]


class Odd:
    """Samples as the first, but sample `at`, which is `how` (in the middle of a chunk), and sample
    `raises_at`, whose dataset raises."""

    def __init__(self, at, how, raises_at=None):
        self.at, self.how, self.raises_at = at, how, raises_at

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == self.raises_at:
            raise KeyError(f"no sample {i}")
        x = torch.full((3,), i, dtype=torch.int32)
        if i == self.at:
            if self.how == "shape":
                return torch.zeros(4, dtype=torch.int32), i
            if self.how == "dtype":
                return torch.zeros(3, dtype=torch.int64), i
            if self.how == "structure":
                return x, i, i
            if self.how == "list":  # another container, the same leaves: the general path writes it
                return [x, i]
            if self.how == "array":  # an array for a tensor: the general path writes it
                return np.full((3,), i, np.int32), i
            if self.how == "overflow":
                return x, 1 << 70
            if self.how == "bool":
                return x, True
        return x, i


@pytest.mark.parametrize("how, text", [
    ("shape", "sample 13: sample[0] is int32[4]; the first sample's was int32[3]"),
    ("dtype", "sample 13: sample[0] is int64[3]; the first sample's was int32[3]"),
    ("structure", "sample 13 has 3 leaves"),
    ("bool", "sample 13: sample[1] is bool[]; the first sample's was int64[]"),
    ("overflow", "verflow")])
def test_a_refusal_in_the_middle_of_a_chunk_names_its_sample_and_comes_before_a_later_error(how, text):
    for workers in (0, 2):
        with Loader(Odd(13, how, raises_at=14), batch_size=8, workers=workers, chunk=8, device="cpu") as loader:
            it = iter(loader)
            assert next(it)[1].tolist() == list(range(8))
            with pytest.raises((ValueError, RuntimeError)) as e:
                next(it)
            said = " ".join([str(e.value), *getattr(e.value, "__notes__", [])])  # workers=0: the error as it is
            assert "sample 13" in said and text in said, said[:400]
            if how in ("shape", "dtype"):
                assert "pad=('sample[0]',)" in str(e.value)


@pytest.mark.parametrize("how", ["list", "array"])
def test_a_sample_the_fast_path_does_not_recognise_is_written_by_the_general_path(how):
    with Loader(Odd(13, how), batch_size=8, workers=2, chunk=8, device="cpu") as loader:
        for k, (x, y) in enumerate(loader):
            assert y.tolist() == list(range(8 * k, 8 * k + 8))
            assert torch.equal(x, y.to(torch.int32)[:, None].expand(8, 3))


class Sometimes:
    """Draws from random and numpy only at some samples (and from torch at others): lazily seeded
    generators must give the bytes of eagerly seeded ones."""

    def __len__(self):
        return 60

    def __getitem__(self, i):
        r = random.random() if i % 7 == 5 else 0.0
        n = float(np.random.rand()) if i % 11 == 9 else 0.0
        t = float(torch.rand(1)) if i % 5 == 1 else 0.0
        return torch.tensor([r, n, t], dtype=torch.float64), i


class Counting:
    def __init__(self):
        self.calls = 0

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([random.random(), float(np.random.rand())]), i


def test_lazily_seeded_generators_give_the_bytes_of_seeding_every_sample():
    want = run(Sometimes(), batch_size=6, workers=0, shuffle=True, seed=3)
    for workers, chunk in ((1, 6), (2, 3), (2, 1)):
        assert same(want, run(Sometimes(), batch_size=6, workers=workers, chunk=chunk, shuffle=True, seed=3))
    values = torch.cat([b[0] for b in want])
    assert (values[:, 0] != 0).sum() >= 5 and (values[:, 1] != 0).sum() >= 4  # it did draw
    # A dataset that draws from both at every sample: seeded at every sample, as before.
    assert same(run(Counting(), batch_size=4, workers=0), run(Counting(), batch_size=4, workers=2, chunk=2))


def test_the_generators_reads_match_their_states_here():
    """The lazy seeding's reads of random's and numpy's generators checked themselves against getstate()
    and .state and are in use (where they are not, every sample is seeded: right, but slower)."""
    import platform

    from ferry._native.loader import numpy_fingerprint, random_fingerprint
    if platform.python_implementation() != "CPython":
        pytest.skip("the read of random's state is CPython's layout")
    r, n = random_fingerprint(), numpy_fingerprint()
    assert r is not None and n is not None
    before = (r(), n())
    random.random()
    assert r() != before[0] and n() == before[1]
    np.random.rand()
    assert n() != before[1]
