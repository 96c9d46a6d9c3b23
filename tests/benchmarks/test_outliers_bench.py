"""benchmarks/outliers.py: the WLB-LLM re-implementation keeps its published rules (every
document once, a level's queue released W at a time, the rest at the epoch's end) and a
tiny case runs end to end with its targets evaluated."""

from __future__ import annotations

import numpy as np

from benchmarks import outliers


def test_wlb_trains_every_document_once_and_releases_a_level_w_at_a_time():
    lengths = np.array([1, 1, 9, 1, 9, 1, 1, 9, 1, 1, 1, 9, 1, 1, 1, 1])
    costs = lengths.astype(np.float64) ** 2
    loads, delays = outliers.wlb_epoch(lengths, costs, 2, 4, (5,))
    assert loads.shape == (4, 2)
    assert np.isclose(loads.sum(), costs.sum())  # every document exactly once
    # Step 0 queues doc 2 (one of W = 2: no release); step 1 queues docs 4 and 7 and
    # releases the two oldest, 2 and 4.
    assert delays[2] == 1 and delays[4] == 0
    # Step 2 queues doc 11 beside doc 7: both go.
    assert delays[7] == 1 and delays[11] == 0
    assert (delays >= 0).all()


def test_a_tiny_case_runs_with_its_targets():
    case = outliers.Case("ln6-1.5", 4, 4096, 4)
    entry = outliers._run_case(case, None, 6)
    assert set(entry["methods"]) == {"today", "delay", "epoch", "wlb"}
    assert entry["methods"]["delay"]["delay_max"] <= 16
    assert set(entry["checks"]) == {"at_most_wlb", "no_cap_violations"}
    assert entry["checks"]["no_cap_violations"]["ok"]
