"""The pipeline benchmark's pieces: the packed micro-batch counts obey the schedule's
rules, and one small case reports consistent figures."""

from __future__ import annotations

import numpy as np

from benchmarks import pipeline as bench
from chronica.core.pipeline import Pipeline


def test_micro_batch_counts_obey_the_schedule():
    lengths = np.random.default_rng(0).integers(1, 4096, 512)
    for pipe in (Pipeline(4), Pipeline(8, 2)):
        costs = bench.micro_costs(lengths, 4096, pipe)
        assert costs.shape[0] == bench.REPLICAS
        assert costs.shape[1] >= pipe.min_micro_batches
        assert costs.shape[1] % pipe.micro_batch_multiple == 0
        total = (bench.HIDDEN_COST * lengths + lengths.astype(float) ** 2).sum()
        assert np.isclose(costs.sum(), total)


def test_a_small_case_reports_consistent_figures():
    case = bench.Case("lognormal(6,1.0)", 4096, Pipeline(4))
    entry = bench._run_case(case, None, 1)
    assert entry["replicas"] == bench.REPLICAS
    # The default order is never worse than the plan's; the long search never worse than it.
    assert entry["ordered"]["median"] <= entry["unordered"]["median"] + 1e-12
    assert entry["long"]["worst"] <= entry["ordered"]["worst"] + 1e-12
    lines = bench.check_targets({"cases": [entry]})
    assert lines[0].startswith(("PASS", "FAIL"))
