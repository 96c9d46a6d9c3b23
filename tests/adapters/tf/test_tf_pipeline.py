"""chronica.adapters.tf.pipeline: an epoch of real RankStreams as rows (the plan's indices,
replicas interleaved, every replica padded to the step's longest example over all of them),
packed micro-batches holding every token once, and the tf.data step data sets that carry
the rows unchanged."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from chronica.adapters.tf import pipeline  # noqa: E402
from chronica.core import ScheduleConfig, Scheduler  # noqa: E402
from chronica.core.packing import Packing  # noqa: E402
from chronica.runtime import RankStream  # noqa: E402

LENGTHS = np.random.default_rng(5).integers(1, 30, size=32)


def streams_of(ranks, world=4, batch=8, packing=None):
    config = ScheduleConfig(num_replicas=world, batch_size=batch, packing=packing)
    scheduler = Scheduler(LENGTHS, config)
    return [RankStream(scheduler, r) for r in ranks]


def test_epoch_rows_interleave_the_served_replicas_and_pad_to_the_steps_longest():
    streams = streams_of([2, 3])
    plan = streams[0].plan()
    rows = list(pipeline.epoch_rows(streams, LENGTHS[:, None], padded=True))
    assert len(rows) == 2 * plan.num_steps
    for i, (epoch, step, indices, weight, pads) in enumerate(rows):
        rank = (2, 3)[i % 2]
        assert (epoch, step) == (0, i // 2) and weight == 1.0
        assert indices.tolist() == plan.local(step, rank).tolist()
        # The longest example of the step over all four replicas, not only the served two.
        every = np.concatenate([plan.local(step, r) for r in range(4)])
        assert pads.tolist() == [LENGTHS[every].max()]
    unpadded = list(pipeline.epoch_rows(streams_of([1]), LENGTHS[:, None], padded=False))
    assert all(pads.tolist() == [0] for *_, pads in unpadded)


def test_static_and_dynamic_steps_carry_the_rows_unchanged():
    rows = list(pipeline.epoch_rows(streams_of([0]), LENGTHS[:, None], padded=True))
    table = pipeline.epoch_table(rows)
    assert [a.dtype for a in table] == [np.int64] * 4 + [np.float32, np.int64]
    assert table[3].sum() == len(table[2]) and table[5].shape == (len(rows), 1)
    static = pipeline.static_steps(lambda: iter([table, table]), varying=1)
    dynamic = pipeline.dynamic_steps(lambda: iter(rows), varying=1)
    for steps, want in ((static, rows + rows), (dynamic, rows)):
        got = [tuple(t.numpy() for t in element) for element in steps]
        assert len(got) == len(want)
        for (e, s, idx, w, pads), row in zip(got, want, strict=True):
            assert (e, s, idx.tolist(), w, pads.tolist()) == (
                row[0],
                row[1],
                row[2].tolist(),
                np.float32(row[3]),
                row[4].tolist(),
            )


def test_packed_micro_batches_hold_every_token_once_with_equal_counts():
    packing = Packing(max_tokens=64, row_length=32)
    streams = streams_of([0, 1], world=2, packing=packing)
    splits = np.concatenate([[0], np.cumsum(LENGTHS)])
    micro = list(pipeline.epoch_micro_batches(streams, packing, splits))
    taken = []
    for epoch, _, m, count, weight, index, segments, positions in micro:
        assert epoch == 0 and 0 <= m < count and weight.dtype == np.float32
        assert index.shape == segments.shape == positions.shape == (2, 32)
        assert ((index >= 0) == (segments > 0)).all()  # padding is where no token is
        taken += index[index >= 0].tolist()
    assert sorted(taken) == list(range(int(LENGTHS.sum())))  # 32 documents, 2 x 16 per epoch
    # The two ranks alternate micro-batch by micro-batch, the same count at every step.
    pairs = [(a[1], a[2], a[3]) for a in micro[::2]]
    assert pairs == [(b[1], b[2], b[3]) for b in micro[1::2]]
    # Every micro-batch was counted by its stream: the epoch is complete.
    assert [s.step for s in streams] == [streams[0].num_steps] * 2
    spec = pipeline.packed_steps(lambda: iter(micro), packing).element_spec
    assert spec[5].shape == (2, 32) and spec[6].dtype == tf.int32
