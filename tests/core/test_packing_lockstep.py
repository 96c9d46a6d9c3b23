"""The lockstep kernels (``chronica.core.packing.lockstep``) against their pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, and the promises of the module
docstring: caps and document limits held, no empty cell where units suffice."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending
from chronica.core.packing.lockstep import lockstep_attempt, step_maxima


@given(st.lists(st.lists(st.sampled_from([0.0, 1.0, 2.5, 4.0]), min_size=3, max_size=3),
                min_size=1, max_size=5))  # fmt: skip
def test_step_maxima_are_the_top_two_of_every_column(table):
    times = np.array(table)
    top, who, second = step_maxima(times)
    for k in range(times.shape[1]):
        column = times[:, k]
        assert top[k] == column.max() and who[k] == int(np.argmax(column))
        rest = np.delete(column, who[k])
        assert second[k] == (rest.max() if rest.size else 0.0)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 16), max_size=40),
    w=st.integers(1, 6),
    num_micro=st.integers(1, 4),
    rows=st.integers(1, 3),
    row_docs=st.integers(1, 5),
    speeds=st.sampled_from(["equal", "levels"]),
    quadratic=st.booleans(),
    data=st.data(),
)
def test_an_attempt_equals_the_reference(
    lengths, w, num_micro, rows, row_docs, speeds, quadratic, data
):
    lengths = np.array(lengths, np.int64)
    n = lengths.shape[0]
    docs = np.array(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)), np.int64)
    costs = lengths + (lengths.astype(np.float64) ** 2 / 16 if quadratic else 0.0) + 0.5
    speed = np.ones(w) if speeds == "equal" else np.array([1.0, 2.0, 0.5] * 2)[:w]
    rank, micro, row = (np.full(n, -1, np.int64) for _ in range(3))
    cells = np.empty((w, num_micro))
    fits = lockstep_attempt(
        lengths, costs, docs, argsort_descending(costs), speed, num_micro, rows, 16, row_docs,
        rank, micro, row, cells,
    )  # fmt: skip
    expected = lockstep_reference.lockstep_pack(
        lengths.tolist(), costs.tolist(), docs.tolist(), speed.tolist(), num_micro, rows, 16,
        row_docs,
    )  # fmt: skip
    assert fits == (expected is not None)
    if expected is None:
        return
    assert (rank.tolist(), micro.tolist(), row.tolist()) == tuple(expected[:3])
    assert cells.tobytes() == np.array(expected[3]).tobytes()
    for r in range(w):
        for k in range(num_micro):
            here = (rank == r) & (micro == k)
            if n >= w * num_micro:
                assert here.any(), "a cell is empty although the step has a unit for each"
            for q in range(rows):
                assert lengths[here & (row == q)].sum() <= 16
                assert docs[here & (row == q)].sum() <= row_docs
