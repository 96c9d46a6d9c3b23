"""``chronica.core.packing.lockstep_rebuild`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), and the rebuild pass's promises: the micro-batch
kept loses only units of its costliest cells, each keeps a unit, the units planned again are
exactly the others, and the pass shortens a step the constructions alone leave long."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending
from chronica.core.packing.lockstep import lockstep_attempt
from chronica.core.packing.lockstep_rebuild import by_idle, moving_units, shed_column


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
