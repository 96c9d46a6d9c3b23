"""The pieces of the FSDP2 lockstep benchmark (benchmarks/fsdp_micro.py) that could be wrong
without the benchmark noticing: torch's baseline covers every document once in equal
micro-batch counts, every method's layout has the same count on every rank, the fit
recovers a known cost and overhead, and the prediction is the fitted model's sum."""

import numpy as np
import pytest

from benchmarks import fsdp_micro as bench
from chronica import CostModel

SETTINGS = bench.Settings(steps=3, repeats=1, documents=12, max_tokens=1024, row=512)


@pytest.mark.parametrize("documents,world,num_micro", [(12, 2, 3), (13, 2, 2), (32, 4, 5)])
def test_torch_baseline_deals_every_document_once_in_equal_counts(documents, world, num_micro):
    layout = bench.torch_micro_batches(documents, world, num_micro)
    assert [len(rank) for rank in layout] == [num_micro] * world
    seen = sorted(int(i) for rank in layout for micro in rank for i in micro)
    # DistributedSampler pads an uneven batch with its first documents, as torch does.
    assert set(seen) == set(range(documents))
    assert len(seen) == -(-documents // world) * world


def test_every_method_runs_the_same_micro_batch_count_on_every_rank():
    model = CostModel.quadratic(b=1.0, c=1e-3)
    for lengths in bench.step_lengths(SETTINGS):
        layouts = bench.layouts(lengths, SETTINGS, model)
        for layout in layouts.values():
            assert len({len(rank) for rank in layout}) == 1
        assert len(layouts["torch"][0]) == len(layouts["micro"][0])
        for name in ("rank", "micro"):
            docs = sorted(int(i) for rank in layouts[name] for m in rank for i in m)
            assert docs == list(range(len(lengths)))
            assert all(lengths[m].sum() <= SETTINGS.max_tokens for r in layouts[name] for m in r)


def test_the_fit_recovers_cost_and_overhead():
    batches = bench.calibration_batches(SETTINGS)
    truth = CostModel(2e-4, 1e-5, 3e-8)
    rows = np.array(
        [
            [len(b), b.sum(), (b.astype(float) ** 2).sum(), 5e-3 + truth(b.astype(float)).sum()]
            for b in batches
        ]
    )
    overhead, model = bench.fit(rows)
    assert overhead == pytest.approx(5e-3, rel=1e-6)
    assert model.to_tuple() == pytest.approx(truth.to_tuple(), rel=1e-5)
    layout = [[np.array([0, 1])], [np.array([2])]]
    lengths = np.array([10, 20, 30])
    expected = [[5e-3 + truth(np.array([10.0, 20.0])).sum()], [5e-3 + truth(np.array([30.0]))[0]]]
    np.testing.assert_allclose(bench.predicted(layout, lengths, overhead, model), expected)
