"""ferry.torch.Loader's chunk protocol at its edges (ferry/_loader/protocol.py, Note [No chunk is lost]): a
worker that dies in the middle of a chunk, a chunk sent twice, a message or a reply lost to an exception
(Ctrl-C) in the main process, and close() while workers hold chunks. Each case ends with the right bytes
or a named error, never a wait: the timeouts here are short, so a lost chunk would fail the test by its
timeout error, not hang it. The no-leak check of test_loader.py runs after each."""
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")
from test_loader import Loader, Numbers, StuckAt, children, no_leaks  # noqa: E402,F401 - no_leaks: autouse fixture

from ferry._c import ClosedError  # noqa: E402


def labels_of(loader):
    return [y.tolist() for _, y in loader]


EXPECTED = [list(range(i, min(i + 4, 37))) for i in range(0, 37, 4)]


class DiesAt(Numbers):
    """Sample 6 kills its worker (SIGKILL, as the out-of-memory killer does) once the test has its first
    batch: positions 0-1 of batch 1 are written, the rest of the chunk never."""

    def __init__(self, flag):
        super().__init__()
        self.flag = flag

    def __getitem__(self, i):
        if i == 6:
            deadline = time.monotonic() + 20
            while not os.path.exists(self.flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def test_a_worker_dying_in_the_middle_of_a_chunk_is_named_at_once_and_closes_the_loader(tmp_path):
    flag = tmp_path / "go"
    loader = Loader(DiesAt(str(flag)), batch_size=4, workers=2, chunk=4, device="cpu", timeout=30)
    it = iter(loader)
    assert next(it)[1].tolist() == [0, 1, 2, 3]
    flag.write_text("")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ferry Loader worker \d \(pid \d+\) was killed by signal SIGKILL.*"
                                           r"the loader is closed"):
        next(it)
    assert time.monotonic() - t0 < 20  # the death, not the timeout
    with pytest.raises(RuntimeError, match="failed earlier"):
        next(iter(loader))
    loader.close()


def interposed(monkeypatch, loader, name, wrap):
    """The loader's engine method `name` replaced by wrap(original, w, msg); the engine."""
    engine = loader._engine
    original = getattr(engine, name)
    monkeypatch.setattr(engine, name, lambda w, msg: wrap(original, w, msg))
    return engine


def test_a_chunk_sent_twice_is_written_twice_and_counted_once(monkeypatch):
    """Every chunk message goes twice down its worker's pipe: the worker writes the same samples again
    (the same seeds, the same bytes) and answers twice; the second answer names an id no longer recorded
    and changes nothing."""
    def twice(send, w, msg):
        send(w, msg)
        if msg[0] == "chunk":
            send(w, msg)
    with Loader(Numbers(), batch_size=4, workers=2, chunk=2, device="cpu", timeout=30) as loader:
        engine = interposed(monkeypatch, loader, "_send", twice)
        for _ in range(2):  # two epochs: the drain between them reads the duplicates too
            assert labels_of(loader) == EXPECTED
        chunks = 2 * sum(-(-len(b) // 2) for b in EXPECTED)  # of both epochs
        # Every duplicate answer read is dropped; those of the last batches may still be on their way.
        assert chunks // 2 <= engine.dropped_replies <= chunks
        made = sum(w["samples"] for w in loader.stats()["workers"])
        assert 2 * 37 + engine.dropped_replies <= made <= 2 * 2 * 37  # counted as made by the workers


def test_a_reply_taken_by_an_exception_is_recovered_by_a_sync_at_the_next_call(monkeypatch):
    """A Ctrl-C after a worker's answer was read from its pipe and before it was counted: the batch would
    wait for it for ever. The next call syncs with the workers and hands that chunk out again."""
    lost = []

    def interrupted(collect, w, msg):
        if msg[0] == "done" and not lost:
            lost.append(msg[1])
            raise KeyboardInterrupt  # the answer is read and dropped
        collect(w, msg)
    with Loader(Numbers(), batch_size=4, workers=2, chunk=2, device="cpu", timeout=10) as loader:
        interposed(monkeypatch, loader, "_collect", interrupted)
        it = iter(loader)
        got = []
        while len(got) < len(EXPECTED):
            try:
                got.append(next(it)[1].tolist())
            except KeyboardInterrupt:
                pass
        assert got == EXPECTED and len(lost) == 1
        assert labels_of(loader) == EXPECTED  # and the next epoch is whole


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_chunk_whose_send_was_interrupted_is_handed_out_again(monkeypatch, when):
    """A Ctrl-C in the send of a chunk, before the message went or after: either way the next call finds
    out by a sync which it was, and the batch is made once with the right bytes."""
    hit = []

    def interrupted(send, w, msg):
        if msg[0] == "chunk" and not hit:
            hit.append(msg[1])
            if when == "after":
                send(w, msg)
            raise KeyboardInterrupt
        send(w, msg)
    with Loader(Numbers(), batch_size=4, workers=2, chunk=2, device="cpu", timeout=10) as loader:
        interposed(monkeypatch, loader, "_send", interrupted)
        it = iter(loader)
        with pytest.raises(KeyboardInterrupt):
            next(it)
        assert [y.tolist() for _, y in it] == EXPECTED
        assert hit


def test_close_while_workers_hold_chunks_returns_within_seconds_and_leaves_no_worker():
    loader = Loader(StuckAt(), batch_size=8, workers=2, chunk=2, device="cpu", timeout=30)
    it = iter(loader)
    assert next(it)[1].tolist() == list(range(8))
    engine = loader._engine
    held = [c.batch.k for w in engine.workers for c in w.chunks.values()]
    assert 1 in held  # batch 1's chunks (sample 13 among them, stuck) were handed out with batch 0's
    pids = [w.pid for w in engine.workers]
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 5  # the stuck worker is killed after a second
    assert not set(pids) & children()
    with pytest.raises(ClosedError):
        next(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_held_slot_is_not_handed_out_again_until_its_wait_returns(workers):
    """Engine.hold(k, wait) (Note [Holding a slot]): batch k's host slot, at slot_address(k), keeps batch
    k's bytes until wait() returns, called just before batch k + slots is granted (or at close())."""
    from ferry._native.loader import read_int64s
    with Loader(Numbers(40), batch_size=4, workers=workers, slots=3, device="cpu", timeout=30) as loader:
        engine = loader._engine
        engine.hold_until_taken = True
        it = iter(loader)
        got = [next(it)[1].tolist()]
        layout, address = engine.layout, engine.slot_address(0)
        seen = []
        engine.hold(0, lambda: seen.append((engine.dispatch_next, read_int64s(address + layout.offsets[1], 4))))
        got += [y.tolist() for _, y in it]
        assert got == [list(range(i, i + 4)) for i in range(0, 40, 4)]
        assert seen == [(3, [0, 1, 2, 3])]  # before batch 3 (0 + slots) was granted: batch 0's labels still there
        with pytest.raises(RuntimeError, match="batch 1's slot was already handed to batch 4"):
            engine.hold(1, lambda: None)
        last = engine.taken - 1
        assert engine.slot_address(last) == engine.mapping.address + engine.prefetcher.slot_offset(last)
        engine.hold(last, lambda: seen.append("closed"))
    assert seen[-1] == "closed"  # close() waits for a hold before it frees the slots
