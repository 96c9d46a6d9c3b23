"""The refinement's trade search (``chronica.core.packing.trades``) against its pure-Python
twins in ``tests/helpers/reference.py``: the trade chosen (a scan of every candidate, ties
to the first found, also among equal costs and unequal speeds) and the candidates counted."""

from __future__ import annotations

import numpy as np
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.packing.trades import best_trade, trade_work


@settings(max_examples=300, deadline=None)
@given(
    units=st.lists(
        st.tuples(
            st.integers(0, 3),  # rank
            st.integers(0, 1),  # micro-batch
            st.integers(0, 1),  # row
            st.integers(1, 6),  # tokens
            st.sampled_from([1.0, 2.0, 3.0, 5.0, 8.0, 13.0]),  # cost (ties on purpose)
            st.integers(1, 2),  # documents
        ),
        max_size=24,
    ),
    speeds=st.lists(st.sampled_from([1.0, 2.0, 0.5]), min_size=4, max_size=4),
    partners=st.sets(st.integers(0, 3)),
    pairs=st.booleans(),
    room=st.integers(0, 6),
    gain=st.sampled_from([0.0, 1e-9, 0.5]),
)
def test_best_trade_is_the_scan_of_every_candidate(units, speeds, partners, pairs, room, gain):
    rank, micro, row, lengths, docs = (
        np.array([u[x] for u in units], np.int64) for x in (0, 1, 2, 3, 5)
    )
    costs = np.array([u[4] for u in units])
    speed = np.array(speeds)
    free = np.full((4, 2, 2), room, np.int64)
    slots = np.full((4, 2, 2), 2, np.int64)
    loads = np.zeros(4)
    np.add.at(loads, rank, costs)
    a = int(np.argmax(loads / speed))
    partner = np.array([r in partners and r != a for r in range(4)])
    got = best_trade(
        lengths, costs, docs, speed, free, slots, rank, micro, row, loads, a, partner, pairs, gain
    )
    expected = reference.pack_best_trade(
        lengths.tolist(), costs.tolist(), docs.tolist(), speeds, free.tolist(), slots.tolist(),
        rank.tolist(), micro.tolist(), row.tolist(), loads.tolist(), a,
        {r for r in partners if r != a}, pairs, gain,
    )  # fmt: skip
    assert got == (expected if expected is not None else (-1, -1, -1))


@given(
    cells=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 1)), max_size=30),
    partners=st.sets(st.integers(0, 2)),
    num_mine=st.integers(0, 5),
    pairs=st.booleans(),
)
def test_trade_work_counts_what_best_trade_looks_at(cells, partners, num_mine, pairs):
    rank, micro, row = (np.array([c[x] for c in cells], np.int64) for x in range(3))
    partner = np.array([r in partners for r in range(3)])
    scratch = np.zeros(3 * 2 * 2, np.int64)
    got = trade_work(rank, micro, row, partner, num_mine, scratch, (3, 2, 2), pairs)
    assert got == reference.pack_trade_work(
        rank.tolist(), micro.tolist(), row.tolist(), partners, num_mine, pairs
    )
    assert not scratch.any()  # left zero for the next call
