"""``chronica.core.packing.epoch``: steps cut from a stream (``step_starts``) and epochs
assembled from packed steps (``pack_epoch``, ``pack_steps``)."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.packing import Packing, pack_epoch, pack_steps, pieces, step_starts

# --- step cuts ------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 50), max_size=60),
    batch_size=st.integers(1, 9),
    budget=st.integers(1, 120),
)
def test_step_starts_in_both_modes(tokens, batch_size, budget):
    array = np.array(tokens, dtype=np.int64)
    n = len(tokens)
    by_count = step_starts(array, batch_size, None)
    assert by_count.tolist() == [*range(0, n, batch_size), n]
    by_budget = step_starts(array, None, budget)
    assert by_budget.dtype == np.int64
    assert by_budget.tolist() == [*reference.budget_starts(tokens, budget), n]
    # The token budget wins over batch_size when both are given.
    assert step_starts(array, batch_size, budget).tolist() == by_budget.tolist()
    for s in range(len(by_budget) - 1):
        step = tokens[by_budget[s] : by_budget[s + 1]]
        assert len(step) >= 1
        assert sum(step) <= budget or len(step) == 1
        if by_budget[s + 1] < n:  # a step stops only where the next document overflows it
            assert sum(step) + tokens[by_budget[s + 1]] > budget


def test_step_starts_without_a_step_size_is_refused():
    with pytest.raises(ValueError, match=r"batch_size=.*tokens_per_step="):
        step_starts(np.array([1, 2]), None, None)


# --- epochs ---------------------------------------------------------------------------------


def _epoch(sizes, owners, w, packing, batch_size, drop_last=False):
    table = pieces(np.asarray(sizes, dtype=np.float64), packing)
    return table, pack_epoch(
        [np.asarray(o, dtype=np.int64) for o in owners],
        [np.asarray(r, dtype=np.int64) for r in _owner_ranks(len(owners), w)],
        w,
        table,
        table.length.astype(np.float64),
        packing,
        batch_size,
        drop_last,
    )


def _owner_ranks(owners: int, w: int) -> list[np.ndarray]:
    return np.array_split(np.arange(w), owners)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=80),
    w=st.integers(1, 4),
    owners=st.sampled_from([1, 2]),
    batch_size=st.integers(1, 12),
    split=st.booleans(),
    balance=st.sampled_from(["rank", "micro"]),
    pad=st.sampled_from([1, 4]),
    row_docs=st.sampled_from([None, 2]),
)
def test_every_document_is_packed_once_within_the_caps(
    sizes, w, owners, batch_size, split, balance, pad, row_docs
):
    owners = min(owners, w)
    packing = Packing(
        max_tokens=32,
        row_length=16,
        long_documents="split" if split else "truncate",
        balance=balance,
        pad_multiple=pad,
        max_documents_per_row=row_docs,
    )
    streams = np.array_split(np.arange(len(sizes)), owners)
    table, epoch = _epoch(sizes, streams, w, packing, batch_size)
    steps = epoch.bounds.shape[0]
    assert epoch.num_dropped == 0
    assert epoch.bounds.shape == (steps, w + 1) and epoch.loads.shape == (steps, w)
    # Every piece exactly once; a document's pieces all in one step.
    assert sorted(epoch.layout["pieces"].tolist()) == list(range(table.doc.shape[0]))
    np.testing.assert_array_equal(epoch.indices, table.doc[epoch.layout["pieces"]])
    first, bounds = epoch.layout["first"], epoch.layout["bounds"]
    num_micro = epoch.layout["num_micro"]
    assert first.tolist() == [0, *np.cumsum(num_micro * w).tolist()]
    for s in range(steps):
        for slot in range(first[s], first[s + 1]):
            span = slice(bounds[slot], bounds[slot + 1])
            padded = packing.padded(epoch.layout["lengths"][span])
            assert padded.sum() <= packing.max_tokens
            rows = epoch.layout["rows"][span]
            for row in np.unique(rows):
                assert padded[rows == row].sum() <= packing.length
                assert (rows == row).sum() <= (row_docs or len(rows))
        # The weights average to the step's mean (a step left empty weighs nothing).
        weights = epoch.layout["weights"][first[s] : first[s + 1]]
        empty = bounds[first[s]] == bounds[first[s + 1]]
        assert weights.sum() == pytest.approx(0.0 if empty else w)


def test_drop_last_drops_a_partial_last_step_and_counts_its_documents():
    sizes = [4] * 10
    packing = Packing(max_tokens=8)
    _, kept = _epoch(sizes, [np.arange(10)], 2, packing, 4)
    _, dropped = _epoch(sizes, [np.arange(10)], 2, packing, 4, drop_last=True)
    assert kept.bounds.shape[0] == 3 and kept.num_dropped == 0
    assert dropped.bounds.shape[0] == 2 and dropped.num_dropped == 2
    assert sorted(dropped.indices.tolist()) == list(range(8))


def test_a_token_budget_cuts_steps_by_tokens():
    sizes = [5, 5, 5, 5, 5, 5]
    packing = Packing(max_tokens=8, tokens_per_step=10)
    _, epoch = _epoch(sizes, [np.arange(6)], 1, packing, None)
    assert epoch.bounds.tolist() == [[0, 2], [2, 4], [4, 6]]


def test_pack_steps_give_every_rank_the_steps_largest_micro_batch_count():
    packing = Packing(max_tokens=8)
    table = pieces(np.array([8.0, 8.0, 8.0, 1.0]), packing)
    # Owner 0 (ranks 0, 1) needs two micro-batches per rank, owner 1 (rank 2) one.
    packed = pack_steps(
        [[np.array([0, 1, 2]), np.array([3])]],
        [np.array([0, 1]), np.array([2])],
        3,
        table,
        table.length.astype(np.float64),
        packing,
    )
    assert packed.layout["num_micro"].tolist() == [2]
    assert packed.bounds.tolist() == [[0, 2, 3, 4]]
    assert packed.num_dropped == 0


def test_pack_steps_report_progress_after_every_step():
    packing = Packing(max_tokens=8)
    table = pieces(np.ones(4), packing)
    seen = []
    pack_steps(
        [[np.array([0, 1])], [np.array([2, 3])]],
        [np.array([0, 1])],
        2,
        table,
        np.ones(4),
        packing,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(1, 2), (2, 2)]


def test_equal_inputs_give_byte_identical_epochs():
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 64, 300)
    packing = Packing(max_tokens=128, row_length=64)
    _, a = _epoch(sizes, [np.arange(300)], 4, packing, 32)
    _, b = _epoch(sizes, [np.arange(300)], 4, packing, 32)
    assert a.indices.tobytes() == b.indices.tobytes()
    assert a.loads.tobytes() == b.loads.tobytes()
    for key in a.layout:
        assert a.layout[key].tobytes() == b.layout[key].tobytes()
