"""The lockstep kernels (``chronica.core.packing.lockstep``) against their pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, and the promises of the module
docstring: caps and document limits held, no empty cell where units suffice."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending
from chronica.core.packing.lockstep import lockstep_attempt, speed_classes


@given(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=1, max_size=9))
def test_speed_classes_group_equal_speeds_in_rank_order(speeds):
    level, members, size = speed_classes(np.array(speeds))
    classes: dict[float, list[int]] = {}
    for r, s in enumerate(speeds):
        classes.setdefault(s, []).append(r)
    assert size.tolist() == [len(v) for v in classes.values()]
    for g, ranks in enumerate(classes.values()):
        assert members[g, : len(ranks)].tolist() == ranks
        assert all(level[r] == g for r in ranks)


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 16), max_size=40),
    w=st.integers(1, 6),
    num_micro=st.integers(1, 4),
    rows=st.integers(1, 3),
    row_docs=st.integers(1, 5),
    speeds=st.sampled_from(["equal", "levels", "tied"]),
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
    speed = {
        "equal": np.ones(w),
        "levels": np.array([1.0, 2.0, 0.5, 1.5, 3.0, 0.25])[:w],
        "tied": np.array([1.0, 2.0, 1.0, 2.0, 1.0, 2.0])[:w],
    }[speeds]
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
