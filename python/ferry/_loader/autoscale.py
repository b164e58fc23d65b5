"""workers="auto": how many of a Loader's worker processes get chunks (framework-neutral).

The Loader starts one worker per core it may use but one (the main process's), and this controller sets
how many of them the engine hands chunks to (Engine.active; the others block on their pipes and use no
CPU). Every WINDOW batches taken it measures what the workers cost per batch (their busy seconds, the
dataset and the write, over the samples they made) and how long the consumer takes per batch by itself
(the time between next() calls less the time next() waited for the batch), and sets

    active = ceil(MARGIN * cost per batch / consumer seconds per batch)

clamped to [1, started]: enough workers that the consumer never waits, with a margin for jitter. Where
the consumer still waited for more than WAITED of a window, it adds at least one. The first window after
a new epoch's first batch is not measured (the slots fill then). stats()["autoscale"] reports the
choice and its history.
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Tuple

WINDOW = 8  # batches between decisions
MARGIN = 1.25  # workers made for each one the measured rate needs
WAITED = 0.02  # the share of a window the consumer may wait before a worker is added regardless


class Autoscale:
    """Sets engine.active from the batches the consumer takes (see the module)."""

    def __init__(self, engine: Any, batch_size: int, started: int) -> None:
        self.engine, self.batch_size, self.started = engine, batch_size, started
        engine.active = started
        self.history: List[Dict[str, Any]] = []
        self._skip = True  # the next window fills the slots: not measured
        self._begin: Optional[float] = None
        self._count = 0
        self._waited = 0.0
        self._busy0 = self._samples0 = 0.0

    @property
    def active(self) -> int:
        return int(self.engine.active)

    def new_epoch(self) -> None:
        """An epoch starts: its first window is not measured."""
        self._begin, self._skip = None, True

    def _totals(self) -> Tuple[float, int]:
        ws = self.engine.workers
        return sum(w.seconds for w in ws), sum(w.samples for w in ws)

    def taken(self, waited: float) -> None:
        """A batch was taken after next() waited `waited` seconds for it."""
        now = time.perf_counter()
        if self._begin is None:  # the first batch of an epoch: the window starts after it
            self._begin, self._count, self._waited = now, 0, 0.0
            self._busy0, self._samples0 = self._totals()
            return
        self._count += 1
        self._waited += waited
        if self._count < WINDOW:
            return
        wall, waited_total, skip = now - self._begin, self._waited, self._skip
        busy, samples = self._totals()
        made, spent = samples - self._samples0, busy - self._busy0
        self._begin, self._count, self._waited, self._skip = now, 0, 0.0, False
        self._busy0, self._samples0 = busy, samples
        if skip or made <= 0:
            return
        cost = spent / made * self.batch_size  # worker-seconds a batch
        consumer = max(wall - waited_total, 1e-6) / WINDOW  # the consumer's own seconds a batch
        need = math.ceil(MARGIN * cost / consumer)
        if waited_total > WAITED * wall:
            need = max(need, self.active + 1)
        chosen = max(1, min(self.started, need))
        self.engine.active = chosen
        self.history.append({"batch": self.engine.taken, "active": chosen, "cost_s": cost, "consumer_s": consumer,
                             "waited_s": waited_total, "window_s": wall})

    def stats(self) -> Dict[str, Any]:
        return {"active": self.active, "started": self.started, "history": self.history[-16:]}
