"""ferry.torch.Loader's variable-size samples (ferry/_loader/layout.py): ragged leaves (bytes, bytearray,
memoryview by themselves; 1-D tensors and arrays declared with ragged=) as a byte slab with offsets and
lengths (ferry.torch.RaggedBatch), and tensors whose leading dimension varies (pad=) padded to the batch's
longest with their lengths (ferry.torch.Padded), equal to torch.nn.utils.rnn.pad_sequence's. Every batch
against the dataset's samples, with workers 0 and 2, mixed with fixed leaves; capacity refusals naming the
sample, its size, the capacity and the argument; declarations refused by name. The no-leak check of
test_loader.py runs after each."""
import warnings

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from torch.nn.utils.rnn import pad_sequence  # noqa: E402

import ferry.torch as ft  # noqa: E402
from test_loader import Loader, no_leaks  # noqa: E402,F401 - no_leaks: autouse fixture


def blob(i):
    """Sample i's bytes: i % 9 * 37 bytes (sample 0, 9, 18... empty) of a pattern of i."""
    return bytes((i * 7 + j) % 256 for j in range(i % 9 * 37))


class Blobs:
    """Sample i: its bytes (as bytes, bytearray or memoryview by i % 3) and the label i."""

    def __init__(self, n=29):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        b = blob(i)
        return [b, bytearray(b), memoryview(b)][i % 3], i


class Sequences:
    """Sample i: a float32 [L, 3] sequence of i % 6 + (i % 4) * 2 rows (some empty) and the label i."""

    def __len__(self):
        return 27

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(i % 6 + (i % 4) * 2, 3, generator=g), i


class Mixed:
    """Sample i: a fixed image, encoded bytes, a padded int64 token sequence, a ragged int32 array, and a
    number, in a dict."""

    def __len__(self):
        return 21

    def __getitem__(self, i):
        return {"image": torch.full((2, 3), i, dtype=torch.uint8), "jpeg": blob(i + 1),
                "tokens": torch.arange(i % 5 + 1) * i, "ids": np.arange(i % 4, dtype=np.int32) + i, "label": i}


@pytest.mark.parametrize("workers", [0, 2])
def test_ragged_bytes_come_as_a_slab_with_offsets_and_lengths_equal_to_the_samples(workers):
    ds = Blobs()
    with Loader(ds, batch_size=8, workers=workers, chunk=3, device="cpu") as loader:
        seen = 0
        for data, labels in loader:
            assert isinstance(data, ft.RaggedBatch) and len(data) == len(labels)
            want = [blob(i) for i in labels.tolist()]
            assert data.tolist() == want
            assert data.data.dtype == torch.uint8 and data.offsets.dtype == data.lengths.dtype == torch.int64
            assert data.lengths.tolist() == [len(b) for b in want]
            for j, b in enumerate(want):
                assert bytes(data[j].numpy()) == b
                o, n = int(data.offsets[j]), int(data.lengths[j])
                assert bytes(data.data[o:o + n].numpy()) == b
            assert bytes(data[-1].numpy()) == want[-1]
            with pytest.raises(IndexError):
                data[len(want)]
            seen += len(labels)
        assert seen == len(ds)
    stats = loader.stats()
    if workers:
        assert sum(w["bytes"] for w in stats["workers"]) == sum(len(blob(i)) + 8 for i in range(len(ds)))


@pytest.mark.parametrize("workers", [0, 2])
def test_padded_sequences_equal_pad_sequence_with_their_lengths(workers):
    ds = Sequences()
    for value in (0, -1.5):
        with Loader(ds, batch_size=5, workers=workers, pad=("sample[0]",), pad_value=value, device="cpu") as loader:
            for k, ((x, lengths), labels) in enumerate(loader):
                samples = [ds[i][0] for i in labels.tolist()]
                assert labels.tolist() == list(range(5 * k, min(5 * k + 5, len(ds))))
                want = pad_sequence(samples, batch_first=True, padding_value=value)
                assert x.shape == want.shape and x.dtype == torch.float32 and torch.equal(x, want), k
                assert lengths.dtype == torch.int64 and lengths.tolist() == [len(s) for s in samples]


def test_fixed_ragged_and_padded_leaves_mix_and_declared_arrays_keep_their_dtype():
    ds = Mixed()
    got = {}
    for workers in (0, 2):
        with Loader(ds, batch_size=4, workers=workers, chunk=2, pad="sample['tokens']",
                       ragged={"sample['ids']": 64, "sample['jpeg']": None}, device="cpu") as loader:
            rows = []
            for b in loader:
                n = len(b["label"])
                idx = b["label"].tolist()
                assert torch.equal(b["image"], torch.stack([ds[i]["image"] for i in idx]))
                assert b["jpeg"].tolist() == [blob(i + 1) for i in idx]
                tokens = [ds[i]["tokens"] for i in idx]
                assert isinstance(b["tokens"], ft.Padded)
                assert torch.equal(b["tokens"].data, pad_sequence(tokens, batch_first=True))
                assert b["tokens"].lengths.tolist() == [len(t) for t in tokens]
                assert b["ids"].dtype == torch.int32 and len(b["ids"]) == n
                for j, i in enumerate(idx):
                    assert b["ids"][j].tolist() == ds[i]["ids"].tolist()
                rows.append([b["image"].clone(), b["tokens"].data.clone(), b["ids"].offsets.clone(),
                             b["jpeg"].offsets.clone()])
            got[workers] = rows
    # workers=0 and the workers write the same bytes at the same offsets (the groups' rooms)
    assert all(torch.equal(a, b) for x, y in zip(got[0], got[2]) for a, b in zip(x, y))


class Long:
    """Sample i: `small` bytes (a sequence of `small` rows), but sample `at`: `big`."""

    def __init__(self, at, small, big, kind):
        self.at, self.small, self.big, self.kind = at, small, big, kind

    def __len__(self):
        return 24

    def __getitem__(self, i):
        n = self.big if i == self.at else self.small
        return (bytes(n) if self.kind == "bytes" else torch.zeros(n, 2)), i


def grown(loader, epochs=1):
    """Every batch of `epochs` epochs (cloned) and the warnings they raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [[(x.tolist() if isinstance(x, ft.RaggedBatch) else
                 (x.data.clone(), x.lengths.clone()) if isinstance(x, ft.Padded) else x.clone()) for x in batch]
               for _ in range(epochs) for batch in loader]
    return out, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_past_its_capacity_grows_the_slots_with_one_warning_naming_the_new_capacity(workers):
    # ragged: the default capacity, 4096 bytes a sample (twice the first sample's 100, at least 4096), on
    # average over a group of 8 samples, or of the batch when it is smaller
    ds = Long(13, 100, 33000, "bytes")
    with Loader(ds, batch_size=4, workers=workers, chunk=1, device="cpu") as loader:
        batches, said = grown(loader, epochs=2)
        assert [y.tolist() for _, y in batches] == [list(range(i, i + 4)) for i in range(0, 24, 4)] * 2
        assert all(x == [bytes(33000 if i == 13 else 100) for i in y.tolist()] for x, y in batches)
        assert len(said) == 1, said  # once: the second epoch starts with the grown slots
        assert "sample 13: sample[0] has 33000 bytes; with the 1 samples before it in its group (positions 0-1, " \
               "100 bytes) that is 33100 bytes, over its group's 4 x 4096" in said[0]
        assert "laid out again with ragged={'sample[0]': 8448}" in said[0]
        assert loader._engine.layout.leaves[0].capacity == 8448
    # a batch taken before the slots grew stays valid (depth=2: for one further next())
    with Loader(Long(5, 100, 40000, "bytes"), batch_size=4, workers=workers, device="cpu") as loader:
        it = iter(loader)
        before = next(it)[0]
        with pytest.warns(RuntimeWarning, match="laid out again"):
            after = next(it)[0]
        assert before.tolist() == [bytes(100)] * 4 and after.tolist() == [bytes(100), bytes(40000)] + [bytes(100)] * 2
    # the capacity is an average over the group, whatever the workers and the chunk
    cap = {"sample[0]": 4096}
    with Loader(Long(2, 4000, 4400, "bytes"), batch_size=8, workers=workers, chunk=1, ragged=cap,
                device="cpu") as loader:
        batches, said = grown(loader)
        assert said == [] and [len(b) for b in batches[0][0]] == [4000, 4000, 4400] + [4000] * 5
    with Loader(Long(2, 4000, 7000, "bytes"), batch_size=16, workers=workers, chunk=3, ragged=cap,
                device="cpu") as loader:
        batches, said = grown(loader)
        assert [len(b) for b in batches[0][0]] == [4000, 4000, 7000] + [4000] * 13
        assert len(said) == 1 and "sample 7: sample[0] has 4000 bytes; with the 7 samples before it in its " \
            "group (positions 0-7, 31000 bytes) that is 35000 bytes, over its group's 8 x 4096" in said[0]
        assert "ragged={'sample[0]': 8192}" in said[0]
    # padded: the default capacity, twice the first sample's rows (at least 16); one given is kept to
    for given, warned in ((None, True), ({"sample[0]": 17}, False)):
        ds = Long(5, 3, 17, "rows")
        with Loader(ds, batch_size=4, workers=workers, pad=given or ("sample[0]",), device="cpu") as loader:
            batches, said = grown(loader)
            assert len(said) == warned
            if warned:
                assert "sample 5: sample[0] has 17 rows, over its capacity of 16" in said[0]
                assert "laid out again with pad={'sample[0]': 32}" in said[0]
            for (x, lengths), y in batches:
                assert torch.equal(x, pad_sequence([ds[i][0] for i in y.tolist()], batch_first=True))
            assert batches[1][0][1].tolist() == [3, 17, 3, 3]


class Shapes:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.zeros(2, 2), torch.zeros(3), bytes(2), i


def test_declarations_that_do_not_fit_the_first_sample_are_refused_by_name():
    for kwargs, text in (({"pad": "sample[9]"}, r"pad=...\) names sample\[9\], which the first sample does not "
                                                 r"have; its leaves: sample\[0\], sample\[1\], sample\[2\], sample\[3\]"),
                         ({"ragged": ("sample[0]",)}, r"sample\[0\] is float32\[2, 2\]; a ragged leaf is one-dim"),
                         ({"pad": ("sample[2]",)}, r"sample\[2\] is a bytes, whose samples are ragged by themselves"),
                         ({"pad": ("sample[3]",)}, r"sample\[3\] is a scalar")):
        for workers in (0, 1):
            with Loader(Shapes(), batch_size=2, workers=workers, device="cpu", **kwargs) as loader:
                with pytest.raises(ValueError, match=text):
                    iter(loader)
    for kwargs, text in (({"pad": ("a",), "ragged": ("a",)}, "is in both"),
                         ({"pad": {"sample[0]": 0}}, r"a capacity is an integer >= 1 \(the most rows"),
                         ({"ragged": {"sample[0]": -1}}, r"a capacity is an integer >= 1 \(bytes a sample"),
                         ({"ragged": 3}, "expected a leaf path"),
                         ({"pad_value": "x"}, "pad_value='x'")):
        with pytest.raises(ValueError, match=text):
            Loader(Shapes(), batch_size=2, workers=0, device="cpu", **kwargs)


def test_variable_leaves_cross_to_spawned_workers():
    with Loader(Mixed(), batch_size=4, workers=1, start_method="spawn", pad=("sample['tokens']",),
                   ragged=("sample['ids']",), device="cpu") as loader:
        b = next(iter(loader))
        assert b["jpeg"].tolist() == [blob(i + 1) for i in range(4)]
        assert b["tokens"].lengths.tolist() == [1, 2, 3, 4]
