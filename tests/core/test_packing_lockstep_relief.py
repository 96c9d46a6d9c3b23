"""``chronica.core.packing.lockstep_relief.relieve_columns`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, from any placement, and its
promises: the lockstep step never grows, every cell keeps its unit count, rows keep their
token and document limits."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lockstep_constructions import random_placement

from chronica.core.kernels import argsort_descending
from chronica.core.packing.lockstep_relief import relieve_columns

ROW = 16


def _step(cells: np.ndarray, speeds: np.ndarray) -> float:
    return float((cells / speeds[:, None]).max(0).sum())


@settings(max_examples=300, deadline=None)
@given(
    units=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 2)), max_size=40),
    w=st.integers(1, 5),
    num_micro=st.integers(1, 4),
    speeds=st.sampled_from(["equal", "levels", "tied"]),
    budget=st.sampled_from([0, 5, 10_000]),
    data=st.data(),
)
def test_relief_equals_the_reference_and_never_lengthens_the_step(
    units, w, num_micro, speeds, budget, data
):
    lengths = np.array([u[0] for u in units], np.int64)
    docs = np.array([u[1] for u in units], np.int64)
    costs = lengths + lengths.astype(np.float64) ** 2 / 8 + 0.25
    speed = {
        "equal": np.ones(w),
        "levels": np.array([1.0, 2.0, 0.5, 1.5, 3.0])[:w],
        "tied": np.array([1.0, 2.0, 1.0, 2.0, 1.0])[:w],
    }[speeds]
    # Any placement with one row per cell, the cap and document limit held.
    free = np.full((w, num_micro, 1), 4 * ROW, np.int64)
    slots = np.full((w, num_micro, 1), 6, np.int64)
    placed = random_placement(lengths, docs, free, slots, data)
    if placed is None:
        return
    rank, micro, row = placed
    cells = np.zeros((w, num_micro))
    np.add.at(cells, (rank, micro), costs)
    before = _step(cells, speed)
    counts = np.bincount(rank * num_micro + micro, minlength=w * num_micro)
    order = argsort_descending(costs)
    twin = [x.tolist() for x in (free, slots, rank, micro, row, cells)]
    trades = relieve_columns(
        lengths, costs, docs, order, speed, free, slots, rank, micro, row, cells, budget
    )
    expected = lockstep_reference.relieve_columns(
        lengths.tolist(), costs.tolist(), docs.tolist(), order.tolist(), speed.tolist(), *twin,
        budget,
    )  # fmt: skip
    assert trades == expected
    assert (free.tolist(), slots.tolist(), rank.tolist(), micro.tolist()) == tuple(twin[:4])
    assert cells.tobytes() == np.array(twin[5]).tobytes()
    assert _step(cells, speed) <= before * (1 + 1e-12)
    assert (np.bincount(rank * num_micro + micro, minlength=w * num_micro) == counts).all()
    for r in range(w):
        for k in range(num_micro):
            here = (rank == r) & (micro == k)
            assert lengths[here].sum() + free[r, k, 0] == 4 * ROW
            assert docs[here].sum() + slots[r, k, 0] == 6
