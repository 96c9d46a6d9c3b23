"""chronica.runtime.micro: a rank's packed micro-batches of a static plan, micro-batches
built from a window's pieces, and the caps a micro-batch must keep."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.runtime.micro import (
    MicroBatch,
    check_micro_batch,
    micro_batch,
    planned_micro_batches,
)

PACKING = Packing(128, row_length=64, tokens_per_step=2000, long_documents="split")


@pytest.fixture(scope="module")
def packed():
    sizes = np.clip(np.random.default_rng(5).lognormal(3.5, 1, 400).astype(int), 1, 300)
    scheduler = Scheduler(sizes, ScheduleConfig(3, None, packing=PACKING))
    return scheduler, scheduler.plan_epoch(0)


def _tokens(batches):
    out = Counter()
    for m in batches:
        for doc, start, length in zip(m.indices, m.starts, m.lengths, strict=True):
            out.update((int(doc), t) for t in range(start, start + length))
    return out


def test_a_ranks_micro_batches_are_its_entries_of_the_step(packed):
    _, plan = packed
    layout = plan.micro
    for step in range(plan.num_steps):
        counts = set()
        for rank in range(3):
            batches = planned_micro_batches(plan, step, rank)
            counts.add(len(batches))
            span = slice(plan.bounds[step, rank], plan.bounds[step, rank + 1])
            assert np.array_equal(np.concatenate([m.indices for m in batches]), plan.indices[span])
            assert np.array_equal(np.concatenate([m.starts for m in batches]), layout.starts[span])
            assert sum(m.loss_weight for m in batches) == pytest.approx(
                plan.loss_weights[step, rank]
            )
            for m in batches:
                assert check_micro_batch(m, PACKING) is None
        assert counts == {int(layout.num_micro[step])}  # the same count on every rank


def test_micro_batches_of_a_windows_pieces_read_the_pieces_table(packed):
    scheduler, plan = packed
    table = scheduler.pieces
    pieces = plan.micro.pieces[plan.bounds[0, 0] : plan.bounds[0, 1]]
    rows = np.zeros(pieces.shape[0], np.int64)
    batch = micro_batch(table, pieces, rows, 0.25)
    assert np.array_equal(batch.indices, table.doc[pieces])
    assert np.array_equal(batch.starts, table.start[pieces])
    assert np.array_equal(batch.lengths, table.length[pieces])
    assert batch.rows is rows and batch.loss_weight == 0.25
    whole = [micro_batch(table, np.array([p]), np.array([0]), 0.0) for p in pieces]
    assert _tokens(whole) == _tokens([batch])
    with pytest.raises(ValueError, match="pieces and rows must align: got 2 pieces and 1 rows"):
        micro_batch(table, pieces[:2], rows[:1], 0.0)


def _batch(lengths, rows):
    n = len(lengths)
    lengths, rows = np.array(lengths, np.int64), np.array(rows, np.int64)
    return MicroBatch(np.arange(n), np.zeros(n, np.int64), lengths, rows, 1.0)


@pytest.mark.parametrize(
    ("lengths", "rows", "why"),
    [
        ([64, 64], [0, 1], None),
        ([], [], None),
        ([10], [2], "a row outside the 2 rows of a micro-batch"),
        ([10], [-1], "a row outside the 2 rows of a micro-batch"),
        ([40, 30], [0, 0], "a row of 70 tokens (row_length=64)"),
    ],
)
def test_the_caps_a_micro_batch_must_keep(lengths, rows, why):
    assert check_micro_batch(_batch(lengths, rows), Packing(128, row_length=64)) == why


def test_rows_within_their_length_keep_max_tokens():
    # max_tokens=100, rows of 30: 3 rows, so at most 90 tokens fit, under the cap.
    packing = Packing(100, row_length=30)
    assert check_micro_batch(_batch([30, 30, 30], [0, 1, 2]), packing) is None
    assert check_micro_batch(_batch([30, 10], [0, 3]), packing) == (
        "a row outside the 3 rows of a micro-batch"
    )


def test_an_unpacked_plan_has_no_micro_batches():
    plan = Scheduler(np.arange(1, 40), ScheduleConfig(2, 8)).plan_epoch(0)
    with pytest.raises(ValueError, match=r"plan is not packed.*use plan.local\(step, rank\)"):
        planned_micro_batches(plan, 0, 0)
