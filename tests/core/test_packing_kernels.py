"""The packing kernels (``chronica.core.packing.kernels``) one by one against their
pure-Python twins in ``tests/helpers/reference.py``: row and micro-batch fitting, the room
left, the refinement's work bound, and a whole attempt (LPT under row capacities, then
refinement, also where its work bound stops it) byte for byte."""

from __future__ import annotations

import numpy as np
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending
from chronica.core.packing.kernels import (
    fit_micro,
    fit_row,
    largest_room,
    pack_attempt,
    refine,
    work_budget,
)

free_rows = st.lists(st.integers(0, 12), min_size=1, max_size=8)


@given(free=free_rows, length=st.integers(0, 13), docs=st.integers(1, 3), data=st.data())
def test_fit_row_is_the_fullest_row_that_fits(free, length, docs, data):
    slots = data.draw(st.lists(st.integers(0, 3), min_size=len(free), max_size=len(free)))
    got = fit_row(np.array(free, np.int64), np.array(slots, np.int64), length, docs)
    assert got == reference.fit_row(free, length, slots, docs)


@given(
    free=st.lists(free_rows, min_size=1, max_size=5).map(
        lambda rows: [r[: min(len(x) for x in rows)] for r in rows]
    ),
    length=st.integers(0, 13),
    tight=st.booleans(),
    data=st.data(),
)
def test_fit_micro_matches_the_reference(free, length, tight, data):
    loads = data.draw(
        st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=len(free), max_size=len(free))
    )
    slots = [[data.draw(st.integers(0, 2)) for _ in rows] for rows in free]
    docs = data.draw(st.integers(1, 2))
    got = fit_micro(
        np.array(free, np.int64), np.array(slots, np.int64), np.array(loads), length, docs, tight
    )
    assert tuple(got) == tuple(reference.fit_micro(free, loads, length, tight, slots, docs))


@given(free=st.lists(free_rows, min_size=1, max_size=5), data=st.data())
def test_largest_room_is_the_largest_free_row_with_a_slot(free, data):
    width = min(len(r) for r in free)
    free = [r[:width] for r in free]
    slots = [[data.draw(st.integers(0, 1)) for _ in rows] for rows in free]
    got = largest_room(np.array(free, np.int64), np.array(slots, np.int64))
    assert got == reference.largest_room(free, slots)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 16), max_size=40),
    w=st.integers(1, 6),
    num_micro=st.integers(1, 3),
    rows=st.integers(1, 3),
    tight=st.booleans(),
    speeds=st.sampled_from(["equal", "levels"]),
    quadratic=st.booleans(),
    row_docs=st.sampled_from([None, 1, 2, 4]),
    data=st.data(),
)
def test_an_attempt_equals_the_reference(
    lengths, w, num_micro, rows, tight, speeds, quadratic, row_docs, data
):
    lengths = np.array(lengths, np.int64)
    n = lengths.shape[0]
    # Units of one or two documents (groups kept whole), against a per-row document limit.
    docs = np.array(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)), np.int64)
    limit = int(docs.sum()) + 1 if row_docs is None else row_docs
    costs = lengths + (lengths.astype(np.float64) ** 2 / 16 if quadratic else 0.0) + 0.5
    speed = np.ones(w) if speeds == "equal" else np.array([1.0, 2.0, 0.5] * 2)[:w]
    rank, micro, row = (np.full(n, -1, np.int64) for _ in range(3))
    loads = np.empty(w)
    fits = pack_attempt(
        lengths, costs, docs, argsort_descending(costs), speed, num_micro, rows, 16, limit,
        tight, rank, micro, row, loads,
    )  # fmt: skip
    expected = reference.pack(
        lengths, costs, speed, num_micro, rows, 16, tight=tight, docs=docs, row_docs=limit
    )
    assert fits == (expected is not None)
    if expected is None:
        return
    assert (rank.tolist(), micro.tolist(), row.tolist()) == tuple(expected[:3])
    assert loads.tobytes() == np.array(expected[3]).tobytes()
    # The caps hold: no row over its length or its document limit.
    for r in range(w):
        for m in range(num_micro):
            for k in range(rows):
                here = (rank == r) & (micro == m) & (row == k)
                assert lengths[here].sum() <= 16
                assert docs[here].sum() <= limit


@given(n=st.integers(0, 1 << 16), w=st.integers(1, 512))
def test_work_budget_matches_the_reference(n, w):
    assert work_budget(n, w) == reference.pack_work_budget(n, w)


def _refined(lengths, costs, w, num_micro, row_length, budget):
    """LPT by the reference, then the kernel's and the reference's refinement with
    ``budget``: both results as ``(rank, micro, row, loads)`` lists."""
    lpt = reference.pack(lengths, costs, [1.0] * w, num_micro, 1, row_length, refine=False)
    assert lpt is not None
    n = lengths.shape[0]
    free = np.full((w, num_micro, 1), row_length, np.int64)
    slots = np.full((w, num_micro, 1), n + 1, np.int64)
    micro_loads = np.zeros((w, num_micro))
    for i in reference.descending_order(costs):  # the order LPT added them in
        free[lpt[0][i], lpt[1][i], lpt[2][i]] -= lengths[i]
        slots[lpt[0][i], lpt[1][i], lpt[2][i]] -= 1
        micro_loads[lpt[0][i], lpt[1][i]] += costs[i]
    room = np.array([largest_room(free[r], slots[r]) for r in range(w)])
    state = [free.tolist(), slots.tolist(), micro_loads.tolist(), room.tolist()]
    placed = [list(x) for x in lpt]
    reference.pack_refine(
        lengths.tolist(), costs.tolist(), [1] * n, [1.0] * w, False, *state, *placed, budget
    )
    rank, micro, row = (np.array(x, np.int64) for x in lpt[:3])
    loads = np.array(lpt[3])
    ones = np.ones(n, np.int64)
    refine(
        lengths, costs, ones, np.ones(w), False, free, slots, micro_loads, room, rank, micro, row,
        loads, reference.pack_work_budget(n, w) if budget is None else budget,
    )  # fmt: skip
    return [rank.tolist(), micro.tolist(), row.tolist(), loads.tolist()], placed


def test_the_work_bound_stops_the_refinement_as_in_the_reference():
    # 100 documents for 4 ranks of 2 flat micro-batches of 2048 tokens: the cap leaves little
    # room, and many trades each gain a little.
    rng = np.random.default_rng(12)
    lengths = np.clip(np.rint(rng.lognormal(4.5, 1.2, 100)), 1, 2048).astype(np.int64)
    costs = lengths.astype(np.float64) ** 2 + 1000.0 * lengths
    bounded, expected = _refined(lengths, costs, 4, 2, 2048, 20000)
    assert bounded == expected
    unbounded, expected = _refined(lengths, costs, 4, 2, 2048, None)
    assert unbounded == expected
    # The bound stopped it: without it, the refinement went on to a lower slowest rank.
    assert max(unbounded[3]) < max(bounded[3])


def test_the_kernels_a_window_plan_calls_release_the_gil():
    """The kernels a streamed window's planning thread calls are compiled in nopython mode
    (no Python object inside) with ``nogil``: they run beside the reader and the training
    loop instead of holding them up."""
    from chronica.core.packing.epoch import _budget_starts
    from chronica.core.packing.lockstep import lockstep_attempt
    from chronica.core.rng import _uniforms_kernel

    for kernel in (pack_attempt, lockstep_attempt, argsort_descending, _budget_starts,
                   _uniforms_kernel):  # fmt: skip
        assert kernel.targetoptions["nopython"] and kernel.targetoptions["nogil"], kernel
