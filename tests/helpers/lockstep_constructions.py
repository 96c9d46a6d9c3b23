"""One twin test for the lockstep kernel's constructions (``lpt_cells``, ``ranked_cells``):
the same random grids through the numba kernel and its pure-Python twin
(``lockstep_reference``), compared byte for byte, and the promises every construction keeps:
rows keep their token and document limits, every unit is placed once, no cell is empty where
units suffice."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending

ROW = 16

# Draw these with ``@given(**GRIDS)``; pass them on to ``check``.
GRIDS = {
    "lengths": st.lists(st.integers(0, ROW), max_size=40),
    "w": st.integers(1, 6),
    "num_micro": st.integers(1, 4),
    "rows": st.integers(1, 3),
    "row_docs": st.integers(1, 5),
    "speeds": st.sampled_from(["equal", "levels", "tied"]),
    "data": st.data(),
}


def check(kernel, reference, lengths, w, num_micro, rows, row_docs, speeds, data):
    """Run ``kernel`` and ``reference`` on one drawn grid, assert they agree and keep the
    promises; the kernel's cell costs ``(w, num_micro)``, or ``None`` where neither fits."""
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
    fits = kernel(
        lengths, costs, docs, order, speed, ROW, row_docs, free, slots, rank, micro, row, cells
    )
    expected = reference(
        lengths.tolist(), costs.tolist(), docs.tolist(), order.tolist(), speed.tolist(),
        num_micro, rows, ROW, row_docs,
    )  # fmt: skip
    assert fits == (expected is not None)
    if expected is None:
        return None
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
    return cells


def random_placement(lengths, docs, free, slots, data):
    """Any placement of the units in the rows of ``free``/``slots`` (``(ranks, micro-batches,
    rows)``: free tokens and document slots, updated in place) that keeps every row's limits,
    drawn with hypothesis's ``data``, unit by unit in index order: ``(rank, micro, row)``,
    or ``None`` where a unit fits nowhere."""
    n = lengths.shape[0]
    rank, micro, row = (np.empty(n, np.int64) for _ in range(3))
    for i in range(n):
        fits = [
            c for c in range(free.size) if free.flat[c] >= lengths[i] and slots.flat[c] >= docs[i]
        ]
        if not fits:
            return None
        c = fits[data.draw(st.integers(0, len(fits) - 1))]
        rank[i], micro[i], row[i] = np.unravel_index(c, free.shape)
        free[rank[i], micro[i], row[i]] -= lengths[i]
        slots[rank[i], micro[i], row[i]] -= docs[i]
    return rank, micro, row
