"""PyTorch's own DataLoader tests, the cases that apply to ferry.torch.Loader (a map-style dataset) and to
ferry.torch.Prefetcher, ported from pytorch/pytorch `test/test_dataloader.py` at commit
74436f9025609987bbc69c617564f98635b67807 (the case each test comes from is named in its docstring).

Where the case allows, one test runs it through torch's DataLoader and through ferry's Loader and
compares what they give: the same batches (as default_collate makes them: types, dtypes, shapes, values),
the same len(), the same errors. Cases where ferry differs on purpose assert ferry's documented behaviour
and say how it differs (python/README.md, "Loader for DataLoader users"). Left out: batch_size=None and
batch_sampler (a Loader's batches have one size: its slots are sized by it), IterableDatasets and
datapipes (a Loader is map-style: they go through a DataLoader and Prefetcher), pin_memory and CUDA
datasets (ferry pins its own slots; workers never touch CUDA), random_split, samplers' own statistics,
collate internals, the per-worker index queues (ferry splits a batch across workers), fd limits (no
descriptor crosses per batch), 10-million-sample datasets and the 2.5-minute proper-exit matrix
(test_loader.py kills the parent and sends Ctrl-C).

Small datasets, few workers, loaders reused: the file runs in seconds on 2 cores."""
import collections
import ctypes
import math
import os
import time

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

import ferry.torch as ft  # noqa: E402

from test_loader import children, shm_files  # noqa: E402


@pytest.fixture(autouse=True)
def no_leaks():
    shm, kids = shm_files(), children()
    yield
    deadline = time.monotonic() + 5
    while children() - kids and time.monotonic() < deadline:
        time.sleep(0.02)
    assert children() - kids == set(), "worker processes outlived the test"
    assert shm_files() - shm == set(), "files left in /dev/shm"


def Loader(dataset, **kwargs):
    """ferry's Loader on its emulated device (batches are CPU tensors, comparable with a DataLoader's)."""
    kwargs.setdefault("device", "cpu")
    return ft.Loader(dataset, **kwargs)


def same(a, b, where="batch"):
    """a (ferry's) and b (torch's) are the same structure of the same types, dtypes, shapes and values."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} against {type(b).__name__}"
    if isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{where}: {a} against {b}"
    elif isinstance(b, dict):
        assert list(a) == list(b), where
        for k in b:
            same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")


def batches(loader):
    """Every batch of an epoch, cloned (a Loader's batch lives for depth - 1 further next() calls)."""
    def clone(x):
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, dict):
            return type(x)((k, clone(v)) for k, v in x.items())
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*map(clone, x))
        return type(x)(map(clone, x))
    return [clone(b) for b in loader]


DATA = torch.randn(20, 2, 3, 5, generator=torch.Generator().manual_seed(0))
LABELS = torch.randperm(10, generator=torch.Generator().manual_seed(1)).repeat(2)
TENSORS = TensorDataset(DATA, LABELS)  # TestDataLoader.setUp's, 20 samples instead of 100


def test_sequential_batches_match_the_dataloaders():
    """test_sequential_batch, test_sequential_workers, test_seqential_batch_workers (_test_sequential)."""
    for size in (1, 2):
        want = batches(DataLoader(TENSORS, batch_size=size, num_workers=size - 1))
        with Loader(TENSORS, batch_size=size, workers=size) as loader:
            got = batches(loader)
        assert len(got) == len(want) == math.ceil(20 / size)
        for k, (a, b) in enumerate(zip(got, want)):
            same(a, b, f"batch {k}")
            assert torch.equal(a[0], DATA[k * size:(k + 1) * size]) and torch.equal(a[1], LABELS[k * size:(k + 1) * size])


def test_shuffled_epochs_cover_every_sample_once_and_repeat_by_seed():
    """test_shuffle, test_shuffle_batch, test_shuffle_workers (_test_shuffle), test_shuffle_reproducibility.
    The orders differ from a DataLoader's (ferry's is seeded by seed= and the epoch, not torch's
    generator); each covers every sample once."""
    ds = TensorDataset(torch.arange(20))
    with Loader(ds, batch_size=3, workers=2, shuffle=True, seed=42) as a, \
            Loader(ds, batch_size=3, workers=0, shuffle=True, seed=42) as b:
        one, two = (torch.cat([x for x, in batches(a)]).tolist() for _ in range(2))
        assert sorted(one) == sorted(two) == list(range(20)) and one != two  # each epoch its own order
        assert torch.cat([x for x, in batches(b)]).tolist() == one  # the same seed: the same order
    torch_orders = [torch.cat([x for x, in DataLoader(ds, batch_size=3, shuffle=True, generator=torch.Generator()
                                                      .manual_seed(42))]).tolist() for _ in range(2)]
    assert sorted(torch_orders[0]) == list(range(20)) and torch_orders[0] == torch_orders[1]


def test_len_and_drop_last_match_the_dataloaders():
    """test_len (check_len), test_iterabledataset_len's batch sizes on a map-style dataset."""
    ds = TensorDataset(torch.arange(10))
    for size in (1, 2, 3):
        for drop_last in (False, True):
            want = DataLoader(ds, batch_size=size, drop_last=drop_last)
            with Loader(ds, batch_size=size, workers=1, drop_last=drop_last) as got:
                assert len(got) == len(want) == sum(1 for _ in got) == sum(1 for _ in want)
                assert [x.tolist() for x, in batches(got)] == [x.tolist() for x, in want]


def test_a_sampler_gives_the_order_as_in_a_dataloader():
    """_test_sampler (sampler=range(2, 12)), test_random_sampler_len_with_replacement (len with a
    sampler), and a RandomSampler with a seeded generator: the very batches of a DataLoader. Negative
    indices reach dataset[i] as they are, as a DataLoader passes them (a TensorDataset's count from the
    end)."""
    from torch.utils.data import RandomSampler
    with Loader(TENSORS, batch_size=2, workers=2, sampler=range(2, 12)) as loader:
        assert len(loader) == 5
        for i, (x, _) in enumerate(batches(loader)):
            assert len(x) == 2 and torch.equal(x, DATA[i * 2 + 2:i * 2 + 4])
    want = list(DataLoader(TENSORS, batch_size=2, sampler=[-1, 0, -20, 19]))
    with Loader(TENSORS, batch_size=2, workers=1, sampler=[-1, 0, -20, 19]) as loader:
        got = batches(loader)
    assert len(got) == len(want) == 2 and torch.equal(want[0][0], DATA[[19, 0]])
    for k, (a, b) in enumerate(zip(got, want)):
        same(a, b, f"batch {k}")
    for replacement, n in ((True, 25), (False, None)):
        def sampler():
            return RandomSampler(TENSORS, replacement=replacement, num_samples=n,
                                 generator=torch.Generator().manual_seed(7))
        want = DataLoader(TENSORS, batch_size=6, sampler=sampler())
        with Loader(TENSORS, batch_size=6, workers=2, sampler=sampler()) as got:
            assert len(got) == len(want) == math.ceil((n or 20) / 6)
            for k, (a, b) in enumerate(zip(batches(got), want)):
                same(a, b, f"batch {k}")


def test_distributed_samplers_split_the_data_without_duplicates_with_drop_last():
    """test_duplicating_data_with_drop_last: 4 ranks' DistributedSamplers over 9 samples, batches of 2 with
    drop_last: no sample twice; each rank's batches are its DataLoader's. set_epoch reaches the sampler."""
    from torch.utils.data.distributed import DistributedSampler
    data = TensorDataset(torch.arange(9, dtype=torch.int32))
    scanned = []
    for rank in range(4):
        s = DistributedSampler(data, 4, rank)
        want = [x.tolist() for x, in DataLoader(data, batch_size=2, drop_last=True, sampler=s)]
        with Loader(data, batch_size=2, workers=1, drop_last=True, sampler=DistributedSampler(data, 4, rank)) as got:
            mine = [x.tolist() for x, in batches(got)]
            assert mine == want
            got.set_epoch(1)
            assert got.sampler.epoch == 1
        scanned += sum(mine, [])
    assert len(scanned) == len(set(scanned))


def test_invalid_combinations_are_refused_as_by_a_dataloader():
    """test_invalid_ctor_args_combinations: negative workers or timeout, sampler with shuffle, an
    IterableDataset with a map-style loader's options; and test_invalid_assign_after_init."""
    from torch.utils.data import IterableDataset, SequentialSampler
    sampler = SequentialSampler(TENSORS)
    for kwargs, torch_text, ferry_text in (
            ({"num_workers": -1}, "num_workers option should be non-negative", r"num_workers=-1\): expected an "
                                                                               "integer >= 0"),
            ({"timeout": -1}, "timeout option should be non-negative", r"timeout=-1\): expected a positive"),
            ({"sampler": sampler, "shuffle": True}, "sampler option is mutually exclusive with shuffle",
             "sampler is mutually exclusive with shuffle")):
        with pytest.raises(ValueError, match=torch_text):
            DataLoader(TENSORS, batch_size=11, **kwargs)
        with pytest.raises(ValueError, match=ferry_text):
            Loader(TENSORS, batch_size=11, **kwargs)

    class CountingIterableDataset(IterableDataset):
        def __iter__(self):
            return iter(range(20))

        def __len__(self):
            return 20
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        DataLoader(CountingIterableDataset(), shuffle=True)
    with pytest.raises(TypeError, match="is an IterableDataset.*DataLoader and ferry.torch.Prefetcher"):
        Loader(CountingIterableDataset(), batch_size=2)

    dl = DataLoader(TENSORS)
    with Loader(TENSORS, batch_size=1, workers=1) as loader:
        for attr in ("batch_size", "sampler", "drop_last", "dataset"):
            with pytest.raises(ValueError):
                setattr(dl, attr, {})
            with pytest.raises(ValueError, match=f"Loader.{attr} cannot be changed"):
                setattr(loader, attr, {})


class ErrorDataset(Dataset):
    """The source's: a Dataset without __getitem__ (torch's raises NotImplementedError)."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size


def test_a_datasets_error_propagates_with_its_index():
    """test_error, test_error_workers (_test_error). A DataLoader raises at every batch and goes on; a
    Loader raises at the first failed batch, naming the sample, and ends the epoch (on purpose: the
    batches after it would be made for nothing); with workers=0 it raises the dataset's own exception."""
    it = iter(DataLoader(ErrorDataset(41), batch_size=2, shuffle=True, num_workers=2))
    errors = 0
    for _ in range(math.ceil(41 / 2)):
        with pytest.raises(NotImplementedError):
            next(it)
        errors += 1
    with pytest.raises(StopIteration):
        next(it)
    for workers in (2, 0):
        with Loader(ErrorDataset(41), batch_size=2, shuffle=True, workers=workers) as loader:
            with pytest.raises(NotImplementedError) as e:
                list(loader)  # the first sample sizes the slots: raised by iter()
            text = str(e.value) + "".join(getattr(e.value, "__notes__", []))
            assert "sample" in text and ("worker 0" in text if workers else "workers=0" in text), text


def error_worker_init_fn(_):
    raise RuntimeError("Error in worker_init_fn")


def test_an_error_in_worker_init_fn_propagates():
    """test_error_in_init (its map-style part)."""
    it = iter(DataLoader(TENSORS, num_workers=2, worker_init_fn=error_worker_init_fn))
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        list(it)
    it._shutdown_workers()  # at once, not when the traceback that holds the iterator is collected
    loader = Loader(TENSORS, batch_size=1, workers=2, worker_init_fn=error_worker_init_fn)
    with pytest.raises(RuntimeError, match=r"(?s)Error in worker_init_fn.*worker_init_fn\(\d\)"):
        list(loader)
    loader.close()


class SleepDataset(Dataset):
    def __init__(self, size, sleep_sec):
        self.size, self.sleep_sec, self.sleeped = size, sleep_sec, False

    def __getitem__(self, idx):
        if not self.sleeped:
            time.sleep(self.sleep_sec)
            self.sleeped = True
        return idx

    def __len__(self):
        return self.size


def test_a_worker_past_the_timeout_fails_the_batch():
    """test_timeout (_test_timeout): SleepDataset(10, 3), timeout=1, a sleep of 1.5 s for CI: a
    RuntimeError naming the timeout."""
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d+ seconds"):
        next(iter(DataLoader(SleepDataset(10, 1.5), batch_size=2, num_workers=2, timeout=1)))
    with Loader(SleepDataset(10, 1.5), batch_size=2, workers=2, timeout=1) as loader:
        with pytest.raises(RuntimeError, match=r"made no sample 0 within timeout=1.0 s"):
            next(iter(loader))


class SegfaultDataset(Dataset):
    def __init__(self, size):
        self.size = size

    def __getitem__(self, idx):
        return ctypes.string_at(0)

    def __len__(self):
        return self.size


def disable_stderr(worker_id):
    """The source's: keeps the worker's report of its crash off the test's output."""
    with open(os.devnull, 'w') as devnull:
        os.dup2(devnull.fileno(), 2)


def test_a_worker_killed_by_a_signal_is_detected_and_named():
    """test_segfault (_test_segfault): a worker's segmentation fault is a RuntimeError naming the worker
    and the signal, without the out-of-memory hint that only SIGKILL gets. Which of its two wordings
    DataLoader raises depends on timing: "is killed by signal" for one worker, "(pid(s) 1, 2) exited
    unexpectedly" when both have crashed by the time it looks."""
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid(\(s\))? \d+(, \d+)*\) (is killed by signal|exited unexpectedly)"):
        next(iter(DataLoader(SegfaultDataset(10), batch_size=2, num_workers=2, worker_init_fn=disable_stderr)))
    with Loader(SegfaultDataset(10), batch_size=2, workers=2, worker_init_fn=disable_stderr) as loader:
        with pytest.raises(RuntimeError, match=r"worker \d \(pid \d+\) was killed by signal SIGSEGV") as e:
            next(iter(loader))
    assert "out-of-memory" not in str(e.value)


class SeedDataset(Dataset):
    """The source's, its seed taken modulo 2**63: ferry's sample seeds use all 64 bits, and an int64
    batch holds 63 (DataLoader's seeds are below 2**63)."""

    def __init__(self, size):
        self.size = size

    def __getitem__(self, idx):
        return torch.initial_seed() % 2**63

    def __len__(self):
        return self.size


def init_fn(worker_id):
    torch.manual_seed(12345)


def test_seeds_differ_per_sample_and_repeat_by_seed():
    """test_worker_seed (distinct seeds), test_worker_seed_reproducibility, test_worker_init_fn. A
    DataLoader seeds each worker once (base seed + id), and a worker_init_fn's torch.manual_seed(12345)
    holds for its samples; ferry seeds every sample with sample_seed(seed, epoch, index) (the bytes do
    not depend on the worker count), after worker_init_fn: on purpose, its seeding does not carry over."""
    torch_seeds = torch.cat(list(DataLoader(SeedDataset(4), batch_size=2, num_workers=2, worker_init_fn=init_fn)))
    assert torch_seeds.tolist() == [12345] * 4
    with Loader(SeedDataset(6), batch_size=2, workers=2, seed=3, worker_init_fn=init_fn) as a, \
            Loader(SeedDataset(6), batch_size=3, workers=1, seed=3) as b:
        seeds = torch.cat(batches(a)).tolist()
        assert seeds == [ft.sample_seed(3, 0, i) % 2**63 for i in range(6)] and len(set(seeds)) == 6
        assert torch.cat(batches(b)).tolist() == seeds  # whatever the workers and batching


class WorkerInfoDataset(Dataset):
    """TestWorkerInfoDataset without its barrier: each sample returns what worker_init_fn left."""

    def __len__(self):
        return 6

    def __getitem__(self, idx):
        return torch.tensor(self.value)


def _test_worker_info_init_fn(worker_id):
    """The source's checks, as they are (the attribute's read-only error differs between torch versions)."""
    worker_info = torch.utils.data.get_worker_info()
    assert worker_id == worker_info.id, "worker_init_fn and worker_info should have consistent id"
    assert worker_id < worker_info.num_workers, "worker_init_fn and worker_info should have valid id"
    assert worker_info.seed == torch.initial_seed(), "worker_init_fn and worker_info should have consistent seed"
    dataset = worker_info.dataset
    assert isinstance(dataset, WorkerInfoDataset), "worker_info should have correct dataset copy"
    assert not hasattr(dataset, 'value'), "worker_info should have correct dataset copy"
    with pytest.raises(Exception):
        worker_info.id = 3999
    for k in ['id', 'num_workers', 'seed', 'dataset']:
        assert f"{k}=" in repr(worker_info)
    dataset.value = [worker_id, os.getpid()]


def test_get_worker_info_answers_in_the_workers_and_none_here():
    """test_get_worker_info (_test_get_worker_info): in each worker id, num_workers, seed and the worker's
    copy of the dataset; None in the main process before and after; the main dataset untouched."""
    for make in (lambda ds: DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=_test_worker_info_init_fn),
                 lambda ds: Loader(ds, batch_size=2, workers=2, worker_init_fn=_test_worker_info_init_fn)):
        assert torch.utils.data.get_worker_info() is None
        dataset = WorkerInfoDataset()
        loader = make(dataset)
        if isinstance(loader, DataLoader):
            it = iter(loader)
            data = torch.cat(list(it), 0)
            worker_pids = [w.pid for w in it._workers]
        else:
            data = torch.cat(batches(loader), 0)
            worker_pids = [w["pid"] for w in loader.stats()["workers"]]
            loader.close()
        for worker_id, pid in data.tolist():
            assert pid == worker_pids[worker_id]
        assert torch.utils.data.get_worker_info() is None
        assert not hasattr(dataset, 'value')
        with pytest.raises(AttributeError):
            dataset[0]


class ShardedFiles(Dataset):
    """A map dataset that opens one 'file' per worker by get_worker_info(), as datasets over shards do."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return torch.tensor([i, -1 if info is None else info.id, 0 if info is None else info.num_workers])


def test_a_dataset_sees_its_worker_through_get_worker_info():
    """The sharding idiom of test_iterable_style_dataset's WorkerSpecificIterableDataset, on a map dataset:
    inside workers get_worker_info() names the worker and their number; with workers=0 (num_workers=0)
    it is None, as in a DataLoader's main process."""
    for workers in (2, 0):
        want = torch.cat(list(DataLoader(ShardedFiles(), batch_size=4, num_workers=workers)))
        with Loader(ShardedFiles(), batch_size=4, num_workers=workers) as loader:
            got = torch.cat(batches(loader))
        assert got[:, 0].tolist() == want[:, 0].tolist() == list(range(8))
        assert got[:, 2].tolist() == want[:, 2].tolist() == [workers] * 8
        assert set(got[:, 1].tolist()) <= ({-1} if workers == 0 else {0, 1})


class DictDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, ndx):
        return {'a_tensor': torch.empty(4, 2).fill_(ndx), 'another_dict': {'a_number': ndx}}


Batch = collections.namedtuple('Batch', ['data', 'label', 'random_tensor'])
Data = collections.namedtuple('Data', ['positive', 'negative'])


class NamedTupleDataset(Dataset):
    """The source's, with label=ndx for str(ndx): a Loader's slot holds numbers (a string is refused,
    naming its place: see test_strings_are_refused_naming_their_place)."""

    def __len__(self):
        return 4

    def __getitem__(self, ndx):
        g = torch.Generator().manual_seed(ndx)
        return Batch(data=Data(positive=ndx, negative=-ndx), label=ndx, random_tensor=torch.randn(3, generator=g))


class CustomList(list):
    pass


class CustomDict(dict):
    pass


class Structures(Dataset):
    """Sample i as each of the structures the source collates: numbers (test_default_collate_dtype),
    numpy arrays (test_numpy) and scalars (test_numpy_scalars), a CustomList and a CustomDict
    (test_default_collate_sequence_keep_type, _mapping_keep_type), and a tuple (a list, as collated)."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"int": i - 5, "float": i * 1.1, "bool": i % 3 == 0, "numpy": np.ones((2, 3, 4)) * i,
                "scalars": (np.float64(i), np.float32(i), np.float16(i), np.int64(i), np.int32(i), np.int16(i),
                            np.int8(i), np.uint8(i)),
                "custom_list": CustomList([i, i + 1, i + 2]), "custom_dict": CustomDict({"a": i, "b": -i}),
                "tuple": (torch.full((2,), i), i)}[self.kind]


@pytest.mark.parametrize("make", [DictDataset, NamedTupleDataset] + [
    (lambda kind: lambda: Structures(kind))(k) for k in
    ("int", "float", "bool", "numpy", "scalars", "custom_list", "custom_dict", "tuple")],
    ids=["dict", "namedtuple", "int", "float", "bool", "numpy", "numpy_scalars", "custom_list", "custom_dict",
         "tuple"])
def test_structures_and_dtypes_are_batched_as_default_collate_does(make):
    """TestDictDataLoader.test_sequential_batch, TestNamedTupleDataLoader.test_dataloader_with_namedtuple,
    test_numpy, test_numpy_scalars, test_default_collate_dtype, test_default_collate_sequence_keep_type,
    test_default_collate_mapping_keep_type: every batch the same as a DataLoader's, type and dtype
    included (a tuple sample makes a list)."""
    ds = make()
    want = list(DataLoader(ds, batch_size=2))
    with Loader(ds, batch_size=2, workers=1) as loader:
        got = batches(loader)
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        same(a, b, f"batch {k}")


def test_strings_are_refused_naming_their_place():
    """TestStringDataLoader, NamedTupleDataset's label=str(ndx): default_collate keeps strings as a list;
    a Loader's slots hold numbers, so it refuses one, naming its place (on purpose: decode or map it
    to a number in the dataset, or use a DataLoader and Prefetcher, which passes strings through)."""
    class StringDataset(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, ndx):
            return ('12345'[ndx], ndx)
    assert list(next(iter(DataLoader(StringDataset(), batch_size=2)))[0]) == ['1', '2']
    with Loader(StringDataset(), batch_size=2, workers=1) as loader:
        with pytest.raises(TypeError, match=r"sample\[0\] is a str; a Loader sample holds tensors"):
            iter(loader)
    first = next(iter(ft.Prefetcher(DataLoader(StringDataset(), batch_size=2), device="cpu")))
    assert list(first[0]) == ['1', '2'] and first[1].tolist() == [0, 1]


class EmptyTensorDataset(Dataset):
    def __init__(self, len):
        self.len = len

    def __len__(self):
        return self.len

    def __getitem__(self, any):
        return torch.empty(0)


def test_empty_samples_and_an_error_in_the_loop_end_cleanly():
    """test_large_sampler_indices (_test_large_sampler_indices) at a size for CI: empty tensors batch as
    empty tensors, and an error raised in the training loop leaves no worker behind (the fixture)."""
    with pytest.raises(RuntimeError, match="My Error"):
        with Loader(EmptyTensorDataset(100), batch_size=40, workers=1) as loader:
            for x in loader:
                assert x.numel() == 0 and x.shape == (40, 0)
                raise RuntimeError("My Error")


def test_workers_end_when_an_epoch_is_left_part_way_and_two_loaders_interleave():
    """test_partial_workers (break after some batches, then del: the workers exit) and
    test_multiple_dataloaders (two loaders' iterators used in turn)."""
    one = Loader(TENSORS, batch_size=2, workers=1)
    two = Loader(TENSORS, batch_size=2, workers=2)
    it1, it2 = iter(one), iter(two)
    firsts = [int(next(it)[1][0]) for it in (it1, it1, it2, it2, it1, it2)]
    assert firsts == [LABELS[0], LABELS[2], LABELS[0], LABELS[2], LABELS[4], LABELS[4]]
    pids = [w["pid"] for w in one.stats()["workers"] + two.stats()["workers"]]
    for i, _ in enumerate(one):
        if i == 3:
            break
    del it1, it2, one, two
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


class DummyDataset(Dataset):
    def __init__(self):
        self.data = list(range(10))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        assert self.start == 0
        return self.data[idx]


def test_workers_persist_across_epochs_with_the_dataset_they_started_with():
    """TestDataLoaderPersistentWorkers.test_dataset_not_reset: a Loader's workers live as long as it does
    (persistent_workers=True, always), so a change to the main process's dataset after they started is
    not seen by them."""
    dataset = DummyDataset()
    dataset.start = 0
    with Loader(dataset, batch_size=5, workers=2) as loader:
        for i in range(3):
            assert [x.tolist() for x in batches(loader)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
            dataset.start = i + 1


class ConvDataset(Dataset):
    def __init__(self):
        self.x = torch.ones(1, 1, 2400)
        self[0]  # a convolution in the parent process

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


def test_torch_works_in_forked_workers_after_the_parent_used_its_thread_pool():
    """TestConvAfterFork.test_conv_after_fork (pytorch#53565) and test_no_segfault (pytorch#54752:
    set_num_threads in the parent, then forked workers)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(4, threads))
    try:
        with Loader(ConvDataset(), batch_size=1, workers=1) as loader:
            for x in loader:
                assert x.shape == (1, 1, 1, 2399)
        with Loader([1, 2, 3], batch_size=1, workers=1) as loader:
            assert [x.tolist() for x in batches(loader)] == [[1], [2], [3]]
    finally:
        torch.set_num_threads(threads)


def test_the_prefetcher_gives_the_dataloaders_batches_and_its_attributes():
    """_test_sequential and TestDictDataLoader through a Prefetcher over a DataLoader: the same batches,
    structure untouched; and the loader's sampler, dataset and batch_size read through the Prefetcher."""
    for ds, size in ((TENSORS, 3), (DictDataset(), 2), (NamedTupleDataset(), 2)):
        loader = DataLoader(ds, batch_size=size)
        p = ft.Prefetcher(loader, device="cpu")
        assert p.batch_size == size and p.dataset is ds and p.sampler is loader.sampler and len(p) == len(loader)
        for k, (a, b) in enumerate(zip(batches(p), loader)):
            same(a, b, f"batch {k}")
        p.close()
