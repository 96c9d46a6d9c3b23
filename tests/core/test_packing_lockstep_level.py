"""``chronica.core.packing.lockstep_level.level_steps`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, from any placement, and its
promises: no micro-batch's slowest cell grows, no cell empties, rows keep their token and
document limits."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lockstep_constructions import random_placement

from chronica.core.packing.lockstep_level import level_steps

ROW = 16


@settings(max_examples=100, deadline=None)
@given(
    units=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 2)), max_size=30),
    w=st.integers(1, 5),
    num_micro=st.integers(1, 3),
    speeds=st.sampled_from(["equal", "levels"]),
    data=st.data(),
)
def test_leveling_equals_the_reference_and_never_raises_a_maximum(
    units, w, num_micro, speeds, data
):
    lengths = np.array([u[0] for u in units], np.int64)
    docs = np.array([u[1] for u in units], np.int64)
    costs = lengths + lengths.astype(np.float64) ** 2 / 8 + 0.25
    speed = np.ones(w) if speeds == "equal" else np.array([1.0, 2.0, 0.5, 1.5, 3.0])[:w]
    free = np.full((w, num_micro, 1), 4 * ROW, np.int64)
    slots = np.full((w, num_micro, 1), 6, np.int64)
    placed = random_placement(lengths, docs, free, slots, data)
    if placed is None:
        return
    rank, micro, row = placed
    cells = np.zeros((w, num_micro))
    np.add.at(cells, (rank, micro), costs)
    before = (cells / speed[:, None]).max(0, initial=0.0)
    filled = np.bincount(rank * num_micro + micro, minlength=w * num_micro) > 0
    twin = [x.tolist() for x in (free, slots, rank, micro, row, cells)]
    level_steps(lengths, costs, docs, speed, free, slots, rank, micro, row, cells)
    lockstep_reference.level_steps(
        lengths.tolist(), costs.tolist(), docs.tolist(), speed.tolist(), *twin
    )
    assert (free.tolist(), slots.tolist(), rank.tolist(), micro.tolist()) == tuple(twin[:4])
    assert row.tolist() == twin[4]
    assert cells.tobytes() == np.array(twin[5]).tobytes()
    assert ((cells / speed[:, None]).max(0, initial=0.0) <= before * (1 + 1e-12)).all()
    assert (np.bincount(rank * num_micro + micro, minlength=w * num_micro) > 0)[filled].all()
    for r in range(w):
        for k in range(num_micro):
            here = (rank == r) & (micro == k)
            assert lengths[here].sum() + free[r, k, 0] == 4 * ROW
            assert docs[here].sum() + slots[r, k, 0] == 6
