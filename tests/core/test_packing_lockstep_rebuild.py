"""``chronica.core.packing.lockstep_rebuild`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), and the rebuild pass's promises: the micro-batch
kept loses only units of its costliest cells, each keeps a unit, the units planned again are
exactly the others, and the pass shortens a step the constructions alone leave long; the
spread never lengthens the step, empties no cell and keeps every row's limits."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lockstep_constructions import random_placement

from chronica.core.kernels import argsort_descending
from chronica.core.packing.lockstep import lockstep_attempt
from chronica.core.packing.lockstep_rebuild import (
    by_idle,
    moving_units,
    shed_column,
    spread_column,
)

ROW = 16


@settings(max_examples=100, deadline=None)
@given(
    costs=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]), min_size=1, max_size=30),
    w=st.integers(2, 5),
    num_micro=st.integers(1, 4),
    data=st.data(),
)
def test_shedding_equals_the_reference(costs, w, num_micro, data):
    n = len(costs)
    rank = np.array(data.draw(st.lists(st.integers(0, w - 1), min_size=n, max_size=n)))
    micro = np.array(data.draw(st.lists(st.integers(0, num_micro - 1), min_size=n, max_size=n)))
    cost = np.array(costs)
    cells = np.zeros((w, num_micro))
    np.add.at(cells, (rank, micro), cost)
    k = data.draw(st.integers(0, num_micro - 1))
    j = data.draw(st.integers(1, w - 1))
    assert by_idle(cells).tolist() == lockstep_reference.by_idle(cells.tolist())
    stay, column = np.empty(n, np.bool_), np.empty(w)
    shed_column(cost, rank, micro, cells, k, j, stay, column)
    expected = lockstep_reference.shed_column(costs, rank.tolist(), micro.tolist(),
                                              cells.tolist(), k, j)  # fmt: skip
    assert stay.tolist() == expected[0]
    assert column.tobytes() == np.array(expected[1]).tobytes()
    shed = (micro == k) & ~stay
    assert not (stay & (micro != k)).any()
    level = np.sort(cells[:, k])[::-1][j]
    for r in range(w):
        mine = (rank == r) & (micro == k)
        if shed[mine].any():
            assert stay[mine].any(), "a cell shed its last unit"
            assert cells[r, k] > level
    order = argsort_descending(cost)
    units, sub_order = moving_units(order, stay)
    assert units.tolist() == np.flatnonzero(~stay).tolist()
    assert units[sub_order].tolist() == [i for i in order.tolist() if not stay[i]]


def test_the_rebuild_shortens_a_step_the_constructions_leave_long():
    lengths = np.array([7, 4, 5, 4, 6, 3, 1], np.int64)
    costs = lengths + lengths.astype(np.float64) ** 2 / 8
    docs = np.ones(7, np.int64)
    order = [int(i) for i in argsort_descending(costs)]
    before = lockstep_reference.constructions_pack(
        lengths.tolist(), costs.tolist(), docs.tolist(), order, [1.0, 1.0], 2, 1, 16, 8
    )
    rank, micro, row = (np.empty(7, np.int64) for _ in range(3))
    cells = np.empty((2, 2))
    assert lockstep_attempt(lengths, costs, docs, np.array(order), np.ones(2), 2, 1, 16, 8,
                            rank, micro, row, cells)  # fmt: skip
    after = cells.max(0).sum()
    assert after < lockstep_reference.step(before[5], [1.0, 1.0])
    assert after == 24.75
    assert (np.bincount(rank * 2 + micro, minlength=4) > 0).all()
    tokens = np.bincount(rank * 2 + micro, weights=lengths, minlength=4)
    assert (tokens <= 16).all()


@settings(max_examples=100, deadline=None)
@given(
    units=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 2)), max_size=30),
    w=st.integers(2, 5),
    num_micro=st.integers(2, 4),
    rows=st.integers(1, 2),
    levels=st.integers(1, 4),
    budget=st.sampled_from([0, 40, 10_000]),
    data=st.data(),
)
def test_spreading_equals_the_reference_and_never_lengthens_the_step(
    units, w, num_micro, rows, levels, budget, data
):
    lengths = np.array([u[0] for u in units], np.int64)
    docs = np.array([u[1] for u in units], np.int64)
    costs = lengths + lengths.astype(np.float64) ** 2 / 8 + 0.25
    free = np.full((w, num_micro, rows), 2 * ROW, np.int64)
    slots = np.full((w, num_micro, rows), 6, np.int64)
    placed = random_placement(lengths, docs, free, slots, data)
    if placed is None:
        return
    rank, micro, row = placed
    cells = np.zeros((w, num_micro))
    np.add.at(cells, (rank, micro), costs)
    before = cells.max(0).sum()
    filled = np.bincount(rank * num_micro + micro, minlength=w * num_micro) > 0
    k = data.draw(st.integers(0, num_micro - 1))
    order = argsort_descending(costs)
    twin = [x.tolist() for x in (free, slots, rank, micro, row, cells)]
    looks = spread_column(lengths, costs, docs, order, free, slots, rank, micro, row, cells, k,
                          levels, budget)  # fmt: skip
    expected = lockstep_reference.spread_column(
        lengths.tolist(), costs.tolist(), docs.tolist(), order.tolist(), *twin, k, levels,
        budget,
    )  # fmt: skip
    assert looks == expected
    assert (free.tolist(), slots.tolist(), rank.tolist(), micro.tolist()) == tuple(twin[:4])
    assert row.tolist() == twin[4]
    assert cells.tobytes() == np.array(twin[5]).tobytes()
    assert cells.max(0).sum() <= before
    assert (np.bincount(rank * num_micro + micro, minlength=w * num_micro) > 0)[filled].all()
    for r in range(w):
        for m in range(num_micro):
            for q in range(rows):
                here = (rank == r) & (micro == m) & (row == q)
                assert lengths[here].sum() + free[r, m, q] == 2 * ROW
                assert docs[here].sum() + slots[r, m, q] == 6
