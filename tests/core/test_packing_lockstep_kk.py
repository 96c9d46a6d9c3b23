"""``chronica.core.packing.lockstep_kk.kk_cells`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, and its promises: rows keep their
token and document limits, every unit is placed once, every rank's micro-batches run in
descending cost order, no cell is empty where units suffice."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from lockstep_constructions import GRIDS, check

from chronica.core.packing.lockstep_kk import kk_cells


@settings(max_examples=100, deadline=None)
@given(**GRIDS)
def test_kk_cells_equals_the_reference(**grid):
    cells = check(kk_cells, lockstep_reference.kk_pack, **grid)
    if cells is not None:
        assert (np.diff(cells, axis=1) <= 0).all(), "a rank's micro-batches not by descending cost"


def _plan(costs, w, num_micro, speeds=None):
    n = costs.shape[0]
    free = np.empty((w, num_micro, 1), np.int64)
    slots = np.empty_like(free)
    rank, micro, row = (np.empty(n, np.int64) for _ in range(3))
    cells = np.empty((w, num_micro))
    fits = kk_cells(
        costs.astype(np.int64), costs, np.ones(n, np.int64), np.argsort(-costs, kind="stable"),
        np.ones(w) if speeds is None else speeds, 1 << 20, n + 1, free, slots, rank, micro, row,
        cells,
    )  # fmt: skip
    return fits, rank, cells


def test_kk_cells_splits_the_ranks_by_differencing():
    # Runs of two by ascending cost: (0, 4), (5, 6), (7, 8), partial solutions 4 | 0,
    # 6 | 5, 8 | 7. The largest spread (4 | 0) meets the earlier of the next (6 | 5), its
    # heavier group with the other's lighter one: 9 | 6; then with 8 | 7: 16 | 14, three
    # units each (dealing the runs alike, heaviest to rank 0, would give 19 | 11).
    fits, rank, cells = _plan(np.array([8.0, 7.0, 6.0, 5.0, 4.0, 0.0]), 2, 1)
    assert fits
    assert cells.sum(axis=1).tolist() == [16.0, 14.0]
    assert np.bincount(rank).tolist() == [3, 3]


def test_kk_cells_refuses_ranks_of_unequal_speed():
    fits, _, _ = _plan(np.array([3.0, 2.0, 1.0]), 2, 1, speeds=np.array([1.0, 2.0]))
    assert not fits


def _both(lengths, costs, w, num_micro, row_length):
    # The kernel and its twin on one grid of one row per cell: the kernel's (rank, micro,
    # cells), asserted equal to the twin's.
    n = len(lengths)
    free = np.empty((w, num_micro, 1), np.int64)
    slots = np.empty_like(free)
    rank, micro, row = (np.empty(n, np.int64) for _ in range(3))
    cells = np.empty((w, num_micro))
    costs = np.array(costs)
    order = np.argsort(-costs, kind="stable")
    assert kk_cells(
        np.array(lengths), costs, np.ones(n, np.int64), order, np.ones(w), row_length, n,
        free, slots, rank, micro, row, cells,
    )  # fmt: skip
    expected = lockstep_reference.kk_pack(
        lengths, costs.tolist(), [1] * n, order.tolist(), [1.0] * w, num_micro, 1, row_length, n
    )
    assert (rank.tolist(), micro.tolist(), row.tolist()) == tuple(expected[2:5])
    assert cells.tobytes() == np.array(expected[5]).tobytes()
    return rank.tolist(), micro.tolist(), cells.tolist()


def test_kk_cells_packs_a_rank_tightly_where_its_cheapest_fill_fails():
    # One rank, two micro-batches of 10 tokens: A (5 tokens, cost 10), B (5, 9), C (4, 1),
    # D (6, 0.5). Differencing parts {A, D} and {B, C}: D does not fit beside A, nor beside
    # B and C; the cheapest fill (A, B, then C beside B) leaves D no room either; the
    # tightest packing puts A and B together, C and D together.
    _, micro, cells = _both([5, 5, 4, 6], [10.0, 9.0, 1.0, 0.5], 1, 2, 10)
    assert micro == [0, 0, 1, 1]
    assert cells == [[19.0, 1.5]]


def test_kk_cells_gives_a_unit_no_row_of_its_rank_takes_to_another_rank():
    # X (9 tokens, cost 9) and V (2, 0.05) fall to rank 0 by differencing, 11 tokens for a
    # micro-batch of 10: V goes to rank 1's cell (Y 6 tokens and Z 1), the cheapest with room.
    rank, _, cells = _both([9, 6, 1, 2], [9.0, 8.9, 0.1, 0.05], 2, 1, 10)
    assert rank == [0, 1, 1, 1]
    assert cells == [[9.0], [8.9 + 0.1 + 0.05]]
