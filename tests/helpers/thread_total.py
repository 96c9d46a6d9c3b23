"""An ``Agreement`` for ranks that are threads of one process: its sums meet at a barrier
(what the adapters' all-reduce does across processes)."""

from __future__ import annotations

import functools
import threading

import numpy as np

from chronica.runtime.agreement import Agreement


class ThreadTotal:
    """The all-reduce ``SUM`` of ``world`` threads: every rank's vector, summed when all
    have passed theirs, returned to each."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._barrier = threading.Barrier(world)
        self._vectors: list[np.ndarray] = [np.zeros(0, np.int64)] * world

    def agreement(self, rank: int) -> Agreement:
        """Rank ``rank``'s ``Agreement`` over this sum."""
        return Agreement(functools.partial(self._total, rank), rank, self.world)

    def _total(self, rank: int, vector: np.ndarray) -> np.ndarray:
        self._vectors[rank] = np.asarray(vector, np.int64)
        self._barrier.wait(60)
        total = np.sum(self._vectors, axis=0)
        self._barrier.wait(60)
        return total
