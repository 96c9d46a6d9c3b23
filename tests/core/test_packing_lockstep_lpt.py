"""``chronica.core.packing.lockstep_lpt.lpt_cells`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, and its promises: rows keep their
token and document limits, every unit is placed once, no cell is empty where units suffice."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending
from chronica.core.packing.lockstep_lpt import lpt_cells

ROW = 16


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, ROW), max_size=40),
    w=st.integers(1, 6),
    num_micro=st.integers(1, 4),
    rows=st.integers(1, 3),
    row_docs=st.integers(1, 5),
    speeds=st.sampled_from(["equal", "levels", "tied"]),
    data=st.data(),
)
def test_lpt_cells_equals_the_reference(lengths, w, num_micro, rows, row_docs, speeds, data):
    lengths = np.array(lengths, np.int64)
    n = lengths.shape[0]
    docs = np.array(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)), np.int64)
    costs = lengths + lengths.astype(np.float64) ** 2 / 16 + 0.5
    speed = {
        "equal": np.ones(w),
        "levels": np.array([1.0, 2.0, 0.5, 1.5, 3.0, 0.25])[:w],
        "tied": np.array([1.0, 2.0, 1.0, 2.0, 1.0, 2.0])[:w],
    }[speeds]
    order = argsort_descending(costs)
    free = np.empty((w, num_micro, rows), np.int64)
    slots = np.empty_like(free)
    rank, micro, row = (np.full(n, -1, np.int64) for _ in range(3))
    cells = np.empty((w, num_micro))
    fits = lpt_cells(
        lengths, costs, docs, order, speed, ROW, row_docs, free, slots, rank, micro, row, cells
    )
    expected = lockstep_reference.lpt_pack(
        lengths.tolist(), costs.tolist(), docs.tolist(), order.tolist(), speed.tolist(),
        num_micro, rows, ROW, row_docs,
    )  # fmt: skip
    assert fits == (expected is not None)
    if expected is None:
        return
    assert (free.tolist(), slots.tolist()) == (expected[0], expected[1])
    assert (rank.tolist(), micro.tolist(), row.tolist()) == tuple(expected[2:5])
    assert cells.tobytes() == np.array(expected[5]).tobytes()
    for r in range(w):
        for k in range(num_micro):
            here = (rank == r) & (micro == k)
            if n >= w * num_micro:
                assert here.any(), "a cell is empty although the step has a unit for each"
            for q in range(rows):
                assert lengths[here & (row == q)].sum() + free[r, k, q] == ROW
                assert docs[here & (row == q)].sum() + slots[r, k, q] == row_docs


def test_lpt_cells_breaks_ties_by_the_lower_rank_sum():
    # Four units, four cells: each opens an empty one. 4 opens (0, 0); 3 goes under its
    # maximum on rank 1 (no rise); 2 raises micro-batch 1 equally on either rank and goes to
    # rank 1, whose sum (3) is the lower; 1 takes the last cell.
    free, slots = np.empty((2, 2, 1), np.int64), np.empty((2, 2, 1), np.int64)
    rank, micro, row = (np.empty(4, np.int64) for _ in range(3))
    cells = np.empty((2, 2))
    costs = np.array([4.0, 3.0, 2.0, 1.0])
    assert lpt_cells(np.array([4, 3, 2, 1]), costs, np.ones(4, np.int64), np.arange(4),
                     np.ones(2), 8, 8, free, slots, rank, micro, row, cells)  # fmt: skip
    assert cells.tolist() == [[4.0, 1.0], [3.0, 2.0]]
