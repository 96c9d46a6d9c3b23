"""The OmniLearn peer of the dynamic benchmark against chronica's batch-size controller.

``benchmarks/peers.py`` re-implements OmniLearn's batch-size arithmetic from its description;
these cases pin the behaviour the benchmark reports: its total drifts above the global batch,
its dead-band leaves an imbalance standing, and its correction can break the minimum bound,
where chronica's controller keeps the total exact, the bounds held and the times even.
"""

import numpy as np
import pytest

from benchmarks.peers import omnilearn_batches
from chronica.core.controller import BatchController, water_fill

HL8 = np.array([6.0, 6.0, 4.0, 32.0])


def _ratio(counts, speeds):
    times = np.asarray(counts) / speeds
    return times.max() / times.min()


def test_total_drifts_for_omnilearn_and_stays_exact_for_chronica():
    equal = np.full(4, 32)
    theirs = omnilearn_batches(equal, equal / HL8, 128, 8, 96)
    assert theirs.tolist() == [16, 16, 11, 86]  # every proposal rounded up
    assert theirs.sum() == 129
    ours = BatchController(4, 8, 96).counts(128, np.zeros(4), 1 / HL8, 1.0)
    assert ours.tolist() == [16, 16, 11, 85]
    assert ours.sum() == 128


def test_dead_band_leaves_the_imbalance_that_chronica_removes():
    counts = np.array([18, 18, 12, 80])  # every rank within 20% of its fair share
    assert _ratio(counts, HL8) == pytest.approx(1.2)
    theirs = omnilearn_batches(counts, counts / HL8, 128, 8, 96)
    assert theirs.tolist() == counts.tolist()  # nothing moves: the dead-band holds
    controller = BatchController(4, 8, 96)
    controller.load_state_dict({"shares": counts.tolist(), "full": 128})
    ours = controller.counts(128, np.zeros(4), 1 / HL8, 1.0)
    assert ours.sum() == 128
    assert _ratio(ours, HL8) < 1.04


def test_correction_breaks_the_minimum_bound_that_water_filling_keeps():
    speeds = np.array([32.0, 4.0, 4.0, 32.0])
    counts = np.array([24, 20, 19, 65])
    theirs = omnilearn_batches(counts, counts / speeds, 128, 8, 96)
    assert theirs.tolist() == [49, 7, 7, 65]  # the correction after clipping: 7 < 8
    ours = water_fill(128, np.zeros(4), 1 / speeds, 1.0, 8, 96)
    assert ours.sum() == 128
    assert ours.min() >= 8 and ours.max() <= 96
    assert ours.tolist() == [56, 8, 8, 56]
