"""The lockstep greedy's choice of a cell (``lockstep_greedy``) against a scan of every
cell in the kernels' order (``ladder.cell_before``): the same cell on random states, ranks
of one speed and of two."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core.packing.ladder import speed_classes
from chronica.core.packing.lockstep_greedy import best_cell, best_empty_cell


def _state(seed: int, two_speeds: bool):
    rng = np.random.default_rng(seed)
    w, num_micro, rows = int(rng.integers(2, 7)), int(rng.integers(1, 5)), int(rng.integers(1, 3))
    speeds = np.ones(w) if not two_speeds else np.where(rng.random(w) < 0.5, 1.0, 2.0)
    free = rng.integers(0, 40, (w, num_micro, rows)).astype(np.int64)
    slots = rng.integers(0, 3, (w, num_micro, rows)).astype(np.int64)
    cells = rng.integers(0, 6, (w, num_micro)).astype(np.float64)  # ties on purpose
    count = rng.integers(0, 2, (w, num_micro)).astype(np.int64)
    top = (cells / speeds[:, None]).max(axis=0)
    length, cost, docs = int(rng.integers(1, 30)), float(rng.integers(1, 5)), 1
    return speeds, free, slots, cells, count, top, length, cost, docs


def _scan(speeds, free, slots, cells, top, length, cost, docs, allowed):
    """Every allowed cell with a row for the unit, the least by (rise, slack, time, k, r)."""
    best = None
    w, num_micro, rows = free.shape
    for k in range(num_micro):
        for r in range(w):
            fits = [x for x in range(rows) if free[r, k, x] >= length and slots[r, k, x] >= docs]
            if not allowed[r, k] or not fits:
                continue
            q = min(fits, key=lambda x: (free[r, k, x], x))  # the fullest row, then the lower
            time = (cells[r, k] + cost) / speeds[r]
            rise = max(0.0, time - top[k])
            key = (rise, top[k] - time if rise == 0.0 else 0.0, time, k, r)
            if best is None or key < best[0]:
                best = (key, (r, k, q, time))
    return best[1] if best else (-1, -1, -1, np.inf)


@pytest.mark.parametrize("two_speeds", [False, True])
@pytest.mark.parametrize("seed", range(60))
def test_best_cell_is_the_least_cell_of_a_scan(seed: int, two_speeds: bool) -> None:
    speeds, free, slots, cells, _, top, length, cost, docs = _state(seed, two_speeds)
    w, num_micro, _ = free.shape
    level, members, size = speed_classes(speeds)
    # The ladders: each class's ranks by (cost, rank), per micro-batch.
    ladder = np.zeros((num_micro, size.shape[0], w), np.int64)
    for k in range(num_micro):
        for g in range(size.shape[0]):
            ranks = sorted(members[g, : size[g]].tolist(), key=lambda r: (cells[r, k], r))
            ladder[k, g, : len(ranks)] = ranks
    room = np.where(slots > 0, free, -1).max(axis=2)
    got = best_cell(length, cost, docs, speeds, free, slots, room, cells, top, ladder, size,
                    level, room.max(axis=0))  # fmt: skip
    want = _scan(speeds, free, slots, cells, top, length, cost, docs, np.ones((w, num_micro), bool))
    assert got[:3] == want[:3] and (got[0] < 0 or got[3] == want[3])


@pytest.mark.parametrize("seed", range(60))
def test_best_empty_cell_is_the_least_empty_cell_of_a_scan(seed: int) -> None:
    speeds, free, slots, cells, count, top, length, cost, docs = _state(seed, seed % 2 == 1)
    got = best_empty_cell(length, cost, docs, speeds, free, slots, count, cells, top)
    want = _scan(speeds, free, slots, cells, top, length, cost, docs, count == 0)
    assert got[:3] == want[:3] and (got[0] < 0 or got[3] == want[3])
