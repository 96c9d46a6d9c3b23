"""The pieces of the FSDP2 lockstep benchmark (benchmarks/fsdp_micro.py) that could be wrong
without the benchmark noticing: torch's baseline covers every document once in equal
micro-batch counts, every method's layout has the same count on every rank, the run
alternates calibration batches and steps, times that follow a cost model are predicted
exactly (the same aggregation on both sides, every record read at its place, no noise
added), and the noise figures read known deviations right."""

import numpy as np
import pytest

from benchmarks import fsdp_micro as bench
from chronica import CostModel

SETTINGS = bench.Settings(steps=3, repeats=3, calibration=2, documents=12, max_tokens=1024, row=512)


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


def test_calibration_and_steps_alternate_each_in_its_own_order():
    assert bench.interleaved(2, 2) == [True, False, False, True]
    order = bench.interleaved(4, 6)
    assert order.count(False) == 4 and order.count(True) == 6
    model = CostModel.quadratic(b=1.0, c=1e-3)
    calibration = bench.step_lengths(SETTINGS, calibration=True)
    plans = [bench.layouts(n, SETTINGS, bench.PRIOR) for n in calibration]
    is_step, lengths, layouts = bench.run_order(SETTINGS, calibration, plans, model)
    np.testing.assert_array_equal(lengths[~np.array(is_step)], calibration)
    np.testing.assert_array_equal(lengths[np.array(is_step)], bench.step_lengths(SETTINGS))
    assert [p for p, s in zip(layouts, is_step, strict=True) if not s] == plans


def test_every_method_runs_first_in_turn():
    turns = [bench._turn(shift) for shift in range(3)]
    assert all(sorted(t) == sorted(bench.METHODS) for t in turns)
    assert {t[0] for t in turns} == set(bench.METHODS)


def _record(lengths, plans, overhead, model, repeats):
    """Every rank's record as the ranks write it, times exactly the model's."""
    return [
        {
            m: [
                bench.predicted(plans[i][m], lengths[i], overhead, model)[rank].tolist()
                for _ in range(repeats)
                for i in range(len(plans))
            ]
            for m in bench.METHODS
        }
        for rank in range(SETTINGS.world)
    ]


def test_times_that_follow_a_cost_model_are_predicted_exactly():
    truth, overhead = CostModel(2e-3, 1e-5, 3e-8), 5e-3
    calibration = bench.step_lengths(SETTINGS, calibration=True)
    calibration_plans = [bench.layouts(n, SETTINGS, bench.PRIOR) for n in calibration]
    is_step, lengths, plans = bench.run_order(SETTINGS, calibration, calibration_plans, truth)
    raw = {
        "calibration_lengths": calibration.tolist(),
        "calibration_layouts": {
            m: [[[d.tolist() for d in r] for r in p[m]] for p in calibration_plans]
            for m in bench.METHODS
        },
        "planning_measured": _record(calibration, calibration_plans, overhead, truth, 1),
        "overhead": overhead,
        "cost": list(truth.to_tuple()),
        "is_step": is_step,
        "lengths": lengths.tolist(),
        "layouts": {
            m: [[[d.tolist() for d in r] for r in p[m]] for p in plans] for m in bench.METHODS
        },
        "measured": _record(lengths, plans, overhead, truth, SETTINGS.repeats),
        "ranks": [],
    }
    result = bench.analyse(SETTINGS, raw)
    assert result["overhead"] == pytest.approx(overhead, rel=1e-6)
    assert result["fit_error_max"] == pytest.approx(0.0, abs=1e-9)
    assert result["drift"] == pytest.approx(1.0)
    for m in result["methods"].values():
        for key in ("ratio", "point_ratio", "rank_step_ratio", "planning_ratio", "refit_ratio"):
            assert m[key] == pytest.approx(1.0, rel=1e-9)
        assert m["measured_mean"] == pytest.approx(m["predicted_mean"], rel=1e-9)
        assert m["rank_ratio"] == pytest.approx([1.0] * SETTINGS.world)
        assert m["micro_error_max"] == pytest.approx(0.0, abs=1e-9)
        assert m["ratio_range"] == pytest.approx([1.0, 1.0])
    noise = result["noise"]
    for key in ("single_sd", "median_sd", "median_lift", "balanced_lift"):
        assert noise[key] == pytest.approx(0.0, abs=1e-9)


def test_the_noise_figures_of_known_deviations():
    base = np.array([[1.0, 2.0], [3.0, 4.0]])  # (world, micro-batches)
    cells = [base * (1 + np.array([-0.1, 0.0, 0.1]))[:, None, None]]
    errors = np.array([[0.1, -0.1], [-0.1, 0.1]])
    noise = bench.noise_figures(cells, errors)
    assert noise["single_sd"] == pytest.approx(0.1)
    assert noise["error_mean"] == pytest.approx([0.0, 0.0])
    assert noise["error_sd"] == pytest.approx([0.1, 0.1])
    assert noise["error_correlation"] == pytest.approx(-1.0)
    assert noise["balanced_lift"] == pytest.approx(0.1)
    # every rank's repeats move together: resampled medians never differ across ranks
    assert noise["median_lift"] == pytest.approx(0.0, abs=1e-12)
    assert 0 < noise["median_sd"] < 0.1
