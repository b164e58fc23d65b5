"""workers="auto" (ferry/_loader/autoscale.py): the controller's choice from what it measures, on a fake
engine and clock, and a Loader(workers="auto") whose batches are right and whose stats report the choice."""
from __future__ import annotations

import pytest

from ferry._loader import autoscale


class _Worker:
    def __init__(self):
        self.seconds, self.samples = 0.0, 0


class _Engine:
    def __init__(self, n):
        self.workers = [_Worker() for _ in range(n)]
        self.active = n
        self.taken = 0


def _drive(monkeypatch, *, started, batch, worker_s_per_batch, consumer_s, waited_s, windows=3, a=None):
    """Feeds the controller `windows` windows of batches: each batch costs the workers worker_s_per_batch
    seconds in all, the consumer takes consumer_s by itself and next() waited waited_s for it (`a`: go on
    with that controller)."""
    if a is None:
        clock = [0.0]
        monkeypatch.setattr(autoscale.time, "perf_counter", lambda: clock[0])
        a = autoscale.Autoscale(_Engine(started), batch, started)
        a.clock = clock
        a.new_epoch()
    eng = a.engine
    for _ in range(1 + autoscale.WINDOW * windows):
        a.clock[0] += consumer_s + waited_s
        eng.workers[0].seconds += worker_s_per_batch
        eng.workers[0].samples += batch
        eng.taken += 1
        a.taken(waited_s)
    return a


def test_it_gives_the_consumer_the_workers_its_rate_needs_with_the_margin(monkeypatch):
    # 0.1 worker-seconds a batch, a consumer at 0.02 s a batch: 5 workers' worth, 1.25x -> 7
    a = _drive(monkeypatch, started=15, batch=32, worker_s_per_batch=0.1, consumer_s=0.02, waited_s=0.0)
    assert a.active == 7
    assert [h["active"] for h in a.history] == [7, 7]  # the first window is not measured
    assert a.history[-1]["cost_s"] == pytest.approx(0.1) and a.history[-1]["consumer_s"] == pytest.approx(0.02)


def test_a_cheap_dataset_gets_one_worker_and_a_slow_one_all_of_them(monkeypatch):
    assert _drive(monkeypatch, started=15, batch=32, worker_s_per_batch=0.001, consumer_s=0.05,
                  waited_s=0.0).active == 1
    assert _drive(monkeypatch, started=6, batch=32, worker_s_per_batch=1.0, consumer_s=0.01, waited_s=0.0).active == 6


def test_a_consumer_that_still_waits_gets_one_more(monkeypatch):
    # 0.04 / 0.02 x 1.25 -> 3 workers; then a window where next() waited 9% of the time: 3 + 1
    a = _drive(monkeypatch, started=15, batch=32, worker_s_per_batch=0.04, consumer_s=0.02, waited_s=0.0)
    assert a.active == 3
    a = _drive(monkeypatch, started=15, batch=32, worker_s_per_batch=0.04, consumer_s=0.02, waited_s=0.002,
               windows=1, a=a)
    assert a.history[-1]["active"] == 4 and a.history[-1]["waited_s"] > 0


def test_a_loader_with_auto_workers_loads_every_sample_and_reports_its_choice():
    torch = pytest.importorskip("torch")
    import ferry.torch as ft

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 640

        def __getitem__(self, i):
            return torch.full((8,), i, dtype=torch.int32), i

    with ft.Loader(DS(), batch_size=16, workers="auto", device="host") as L:
        assert L.workers >= 1 and 1 <= L.workers_active <= L.workers
        for epoch in range(2):
            got = [y.tolist() for _, y in L]
            assert sum(got, []) == list(range(640))
        s = L.stats()["autoscale"]
        assert s["started"] == L.workers and 1 <= s["active"] <= L.workers and s["history"]
    with pytest.raises(ValueError, match="'auto'"):
        ft.Loader(DS(), batch_size=16, workers="many", device="host")
