"""Data movement and label skew of plans (``chronica.core.accounting``), on real schedulers:
what every node fetches under each policy, bytes, the Jensen–Shannon divergence's bounds, and
skew per batch and per node."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core import ScheduleConfig, Scheduler, ShufflePolicy, label_skew, movement
from chronica.core.accounting import js_divergence


def _scheduler(shuffle, n=240, w=4, batch=16, groups=None):
    config = ScheduleConfig(w, batch, shuffle=shuffle, groups=groups)
    return Scheduler(np.random.default_rng(n).lognormal(3, 1, n), config)


def test_local_partitions_fetch_nothing_and_partial_fetches_exchanged_samples():
    local = _scheduler(ShufflePolicy.local())
    assert movement(local, 0).total_samples == 0 and movement(local, 3).total_samples == 0
    partial = _scheduler(ShufflePolicy.partial(1.0))
    moved = movement(partial, 1)
    assert moved.total_samples > 0 and moved.bytes is None and moved.total_bytes is None


def test_global_moves_what_a_node_did_not_train_on_the_epoch_before():
    scheduler = _scheduler(True)
    got = movement(scheduler, 2)
    before, now = scheduler.node_samples(1), scheduler.node_samples(2)
    expect = [np.setdiff1d(a, b).shape[0] for a, b in zip(now, before, strict=True)]
    assert got.samples.tolist() == expect and got.epoch == 2
    # Epoch 0 starts from the contiguous shares of a plain sharded copy.
    first = movement(scheduler, 0)
    shares = np.array_split(np.arange(240), 4)
    now = scheduler.node_samples(0)
    assert first.samples.tolist() == [
        np.setdiff1d(a, b).shape[0] for a, b in zip(now, shares, strict=True)
    ]


def test_an_unshuffled_plan_fetches_nothing_after_its_first_epoch():
    assert movement(_scheduler(False), 1).total_samples == 0


def test_bytes_are_summed_per_fetched_sample():
    scheduler = _scheduler(True)
    sample_bytes = np.arange(240) * 3
    got = movement(scheduler, 1, sample_bytes)
    before, now = scheduler.node_samples(0), scheduler.node_samples(1)
    expect = [int(sample_bytes[np.setdiff1d(a, b)].sum()) for a, b in zip(now, before, strict=True)]
    assert got.bytes.tolist() == expect and got.total_bytes == sum(expect)


@pytest.mark.parametrize("bad", [np.ones(239), -np.ones(240), np.ones((240, 2))])
def test_bad_sample_bytes_are_refused(bad):
    with pytest.raises(ValueError, match="sample_bytes must hold one non-negative int"):
        movement(_scheduler(True), 0, bad)


def test_js_divergence_is_zero_for_equal_one_for_disjoint_and_symmetric():
    p, q = np.array([3.0, 1.0, 0.0]), np.array([0.0, 1.0, 3.0])
    assert js_divergence(p, p * 7) == pytest.approx(0.0, abs=1e-15)
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 1.0
    assert js_divergence(p, q) == pytest.approx(js_divergence(q, p))
    assert 0.0 < js_divergence(p, q) < 1.0


def test_label_skew_sees_one_class_batches_and_one_class_nodes():
    plain = Scheduler(np.ones(64), ScheduleConfig(2, 16, shuffle=False))
    by_batch = label_skew(plain, 0, np.arange(64) // 32)  # every batch holds one class
    assert by_batch.batch_mean == by_batch.batch_max == pytest.approx(0.311278, abs=1e-6)
    assert by_batch.node_max == 0.0
    by_node = label_skew(plain, 0, np.arange(64) % 2)  # strided: rank r holds class r
    assert by_node.batch_max == 0.0
    assert by_node.node_mean == pytest.approx(0.311278, abs=1e-6)


def test_label_skew_needs_one_label_per_sample():
    with pytest.raises(ValueError, match=r"labels must hold one label per sample \(64\)"):
        label_skew(Scheduler(np.ones(64), ScheduleConfig(2, 16)), 0, np.zeros(63))
