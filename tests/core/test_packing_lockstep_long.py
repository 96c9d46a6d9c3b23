"""``chronica.core.packing.lockstep_long`` against its pure-Python twin
(``tests/helpers/lockstep_reference.py``), byte for byte, and the construction's promises:
long units first, the filled micro-batches within their costliest cell and the cap, and on
a step with long documents (lognormal(7, 1.5) lengths, a 32k cap, quadratic costs) a plan
shorter than the kernel's without it, every constraint held."""

from __future__ import annotations

import lockstep_reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.kernels import argsort_descending
from chronica.core.packing import Packing, pack_step
from chronica.core.packing.lockstep import _LONG_GAIN, _planned, lockstep_attempt
from chronica.core.packing.lockstep_long import fill_long, long_micro_batches

ROW = 16


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, ROW), max_size=40),
    w=st.integers(1, 5),
    rows=st.integers(1, 2),
    row_docs=st.integers(1, 4),
    extra=st.integers(0, 2),
    quadratic=st.booleans(),
    data=st.data(),
)
def test_the_fill_equals_the_reference(lengths, w, rows, row_docs, extra, quadratic, data):
    n = len(lengths)
    length = np.array(lengths, np.int64)
    docs = np.array(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)), np.int64)
    docs = np.minimum(docs, row_docs)
    costs = length + (length.astype(np.float64) ** 2 / 16 if quadratic else 0.0) + 0.5
    cap = rows * ROW
    q = long_micro_batches(length, cap, w)
    num_micro = q + extra
    order = argsort_descending(costs)
    free = np.full((w, num_micro, rows), ROW, np.int64)
    slots = np.full((w, num_micro, rows), row_docs, np.int64)
    rank, micro, row = (np.full(n, -1, np.int64) for _ in range(3))
    cells, used = np.zeros((w, num_micro)), np.zeros(n, np.bool_)
    built = fill_long(length, costs, docs, order, cap, q, free, slots, rank, micro, row, cells,
                      used)  # fmt: skip
    ref_free = [[[ROW] * rows for _ in range(num_micro)] for _ in range(w)]
    ref_slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    ref = [[-1] * n, [-1] * n, [-1] * n, [[0.0] * num_micro for _ in range(w)], [False] * n]
    expected = lockstep_reference.fill_long(
        lengths, costs.tolist(), docs.tolist(), order.tolist(), cap, q, ref_free, ref_slots, *ref
    )
    assert built == expected
    assert q == -(-sum(2 * x > cap for x in lengths) // w)
    if not built:
        return
    assert (rank.tolist(), micro.tolist(), row.tolist(), used.tolist()) == (
        ref[0], ref[1], ref[2], ref[4],
    )  # fmt: skip
    assert cells.tobytes() == np.array(ref[3]).reshape(w, num_micro).tobytes()
    assert free.tolist() == ref_free and slots.tolist() == ref_slots
    long = 2 * length > cap
    assert used[long].all() and (micro[used] < q).all()
    for k in range(q):
        here = used & (micro == k)
        assert long[here].sum() <= w
        top = max(costs[here & long])
        assert cells[:, k].max() == top, "a short unit raised its micro-batch's maximum"
        assert (here & (rank == 0)).sum() == 1, "the costliest cell took a unit"
        for r in range(w):
            mine = here & (rank == r)
            assert long[mine].sum() <= 1
            for x in range(rows):
                assert length[mine & (row == x)].sum() <= ROW
                assert docs[mine & (row == x)].sum() <= row_docs


def test_long_documents_first_shorten_a_lognormal_step():
    # lognormal(7, 1.5) lengths, a 32k cap, 8 ranks, cost 24576·L + L²: 12 documents over
    # half the cap; the plain plan leaves cells of their micro-batches far below the maximum.
    w, cap = 8, 32768
    lengths = np.random.default_rng(2).lognormal(7, 1.5, 40 * w)
    lengths = np.minimum(np.ceil(lengths), cap).astype(np.int64)
    costs = 24576.0 * lengths + lengths.astype(np.float64) ** 2
    n, num_micro = lengths.shape[0], 4
    rank, micro, row = (np.empty(n, np.int64) for _ in range(3))
    cells = np.zeros((w, num_micro))
    assert _planned(lengths, costs, np.ones(n, np.int64), argsort_descending(costs), np.ones(w),
                    num_micro, 1, cap, n + 1, rank, micro, row, cells)  # fmt: skip
    without = cells.max(0).sum()
    step = pack_step(lengths, costs, w, Packing(max_tokens=cap, balance="micro"), num_micro=4)
    assert step.num_micro == num_micro
    assert step.cells.max(0).sum() < without * 0.98
    # The construction's plan: the 12 long documents in the first two micro-batches.
    long = 2 * lengths > cap
    assert long.sum() == 12 and set(step.micro[long].tolist()) == {0, 1}
    flat = step.rank * num_micro + step.micro
    tokens = np.bincount(flat, weights=lengths, minlength=w * num_micro)
    assert tokens.max() <= cap
    assert (np.bincount(flat, minlength=w * num_micro) > 0).all()
    sums = np.bincount(flat, weights=costs, minlength=w * num_micro).reshape(w, num_micro)
    np.testing.assert_allclose(step.cells, sums)


def test_where_little_is_to_gain_the_differencing_plans_the_rest():
    # A step whose filled micro-batch plus the rest's mean is within ``_LONG_GAIN`` (1%) of
    # the plan, where one more plan by every construction would not pay: the differencing
    # plans the rest, refined, and that plan is kept (0.46% shorter here), the same as the
    # pure-Python twin's.
    w, cap, num_micro = 8, 32768, 4
    lengths = np.random.default_rng(6).lognormal(7, 1.5, 40 * w)
    lengths = np.minimum(np.ceil(lengths), cap).astype(np.int64)
    costs = 24576.0 * lengths + lengths.astype(np.float64) ** 2
    n, order = lengths.shape[0], argsort_descending(costs)
    docs = np.ones(n, np.int64)
    outputs = [(np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
                np.zeros((w, num_micro))) for _ in range(2)]  # fmt: skip
    assert _planned(lengths, costs, docs, order, np.ones(w), num_micro, 1, cap, n + 1, *outputs[0])
    without = outputs[0][3].max(0).sum()
    q = long_micro_batches(lengths, cap, w)
    free = np.full((w, num_micro, 1), cap, np.int64)
    filled, used = np.zeros((w, num_micro)), np.zeros(n, np.bool_)
    slots = np.full((w, num_micro, 1), n + 1, np.int64)
    assert fill_long(lengths, costs, docs, order, cap, q, free, slots, *outputs[1][:3],
                     filled, used)  # fmt: skip
    bound = filled[:, :q].max(0).sum() + costs[~used].sum() / w
    assert without * (1 - _LONG_GAIN) <= bound < without
    assert lockstep_attempt(lengths, costs, docs, order, np.ones(w), num_micro, 1, cap, n + 1,
                            *outputs[1])  # fmt: skip
    rank, micro, row, cells = outputs[1]
    assert cells.max(0).sum() < without * (1 - 0.004)
    assert set(micro[2 * lengths > cap].tolist()) == set(range(q))
    expected = lockstep_reference.lockstep_pack(
        lengths.tolist(), costs.tolist(), docs.tolist(), [1.0] * w, num_micro, 1, cap, n + 1
    )
    assert (rank.tolist(), micro.tolist(), row.tolist()) == tuple(expected[:3])
    assert cells.tobytes() == np.array(expected[3]).tobytes()
