"""``chronica.core.packing.context_kernels.place_loaded`` against its pure-Python twin
(``tests/helpers/cp_reference.py``): LPT under row capacities from a partly taken state,
with and without refinement, loosely and best fit, byte for byte."""

from __future__ import annotations

import cp_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending
from chronica.core.packing.context_kernels import place_loaded


@st.composite
def loaded_steps(draw):
    w = draw(st.integers(1, 6))
    num, rows, length = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(4, 16))
    n = draw(st.integers(0, 14))
    lengths = draw(st.lists(st.integers(1, length), min_size=n, max_size=n))
    costs = [float(x) + draw(st.sampled_from([0.0, 0.5])) for x in lengths]
    taken = draw(st.lists(st.integers(0, length), min_size=w * num * rows, max_size=w * num * rows))
    speeds = draw(st.lists(st.sampled_from([1.0, 1.0, 2.0, 0.5]), min_size=w, max_size=w))
    return lengths, costs, speeds, (w, num, rows, length), taken


@settings(max_examples=200, deadline=None)
@given(case=loaded_steps(), tight=st.booleans(), refined=st.booleans())
def test_place_loaded_matches_the_reference(case, tight, refined):
    lengths, costs, speeds, (w, num, rows, length), taken = case
    free = length - np.array(taken, np.int64).reshape(w, num, rows)
    slots = np.full((w, num, rows), 3, np.int64)
    micro_loads = (length - free).sum(2).astype(np.float64)
    loads = micro_loads.sum(1)
    want = cp_reference.place_loaded(
        lengths, costs, [1] * len(lengths), speeds, tight, refined, free.tolist(),
        slots.tolist(), micro_loads.tolist(), loads.tolist(),
    )  # fmt: skip
    n = len(lengths)
    rank, micro, row = (np.empty(n, np.int64) for _ in range(3))
    c = np.array(costs, np.float64)
    fits = place_loaded(
        np.array(lengths, np.int64), c, np.ones(n, np.int64), argsort_descending(c),
        np.array(speeds), tight, refined, free, slots, micro_loads, loads, rank, micro, row,
    )  # fmt: skip
    assert fits == (want is not None)
    if fits:
        assert (rank.tolist(), micro.tolist(), row.tolist()) == tuple(want[:3])
        assert loads.tolist() == want[3]
        assert (free >= 0).all()
