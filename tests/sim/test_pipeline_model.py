"""The simulator's pipeline model (``chronica.sim.pipeline``, ``--pipeline-stages``): a rank's
load is its micro-batches' makespan, taken from the plan, and one stage changes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chronica.core import ScheduleConfig, Scheduler
from chronica.core.packing import Packing
from chronica.core.pipeline import Pipeline, order_micro_batches, pipeline_makespan
from chronica.sim import ComputeModel, PipelineModel, SimOptions, SizeDistribution, simulate
from chronica.sim.cli import main as simulate_main


def _sizes(n: int = 640, seed: int = 3) -> np.ndarray:
    return SizeDistribution.parse("lognormal:6:1").draw(n, seed)


def _options(**kwargs) -> SimOptions:
    base = {"world": 4, "batch_size": 64, "compute": ComputeModel(1e-3)}
    base.update(kwargs)
    return SimOptions(**base)


def test_one_stage_is_the_sum_of_the_costs():
    sizes = _sizes()
    configs = ("static", "packed,max_tokens=4096,long_documents=truncate")
    plain = simulate(sizes, _options(strategies=configs), progress=False)
    piped = simulate(
        sizes,
        _options(strategies=configs, pipeline=PipelineModel(Pipeline(1))),
        progress=False,
    )
    for a, b in zip(plain.results, piped.results, strict=True):
        np.testing.assert_allclose(a.step_s, b.step_s, rtol=1e-12)


def test_packed_loads_are_each_ranks_micro_batches_makespan():
    sizes = _sizes()
    config = ScheduleConfig(
        num_replicas=4, batch_size=64, packing=Packing(4096, long_documents="truncate")
    )
    sched = Scheduler(sizes, config)
    plan = sched.plan_epoch(0)
    micro = plan.micro
    pipe = Pipeline(4)
    entry_costs = sched.piece_costs[micro.pieces]
    loads = PipelineModel(pipe).packed_loads(micro, entry_costs, 4)
    for s in (0, plan.bounds.shape[0] - 1):
        for r in range(4):
            costs = np.array(
                [
                    entry_costs[micro.bounds[j] : micro.bounds[j + 1]].sum()
                    for j in (micro.index(s, r, m) for m in range(int(micro.num_micro[s])))
                ]
            )
            want = pipeline_makespan(costs[order_micro_batches(costs, pipe)], pipe)
            assert loads[s, r] == pytest.approx(want)


def test_samples_are_micro_batches_and_interleaved_counts_are_completed():
    model = PipelineModel(Pipeline(2, 2), order=False)
    indices = np.arange(5)
    bounds = np.array([[0, 3, 5]])  # rank 0: 3 samples, rank 1: 2
    costs = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    loads = model.sample_loads(indices, bounds, costs)
    pipe = Pipeline(2, 2)
    assert loads[0, 0] == pytest.approx(pipeline_makespan([1.0, 2.0, 3.0, 0.0], pipe))
    assert loads[0, 1] == pytest.approx(pipeline_makespan([4.0, 5.0], pipe))
    assert model.makespan(np.zeros(0)) == 0.0


def test_ordering_never_slows_a_simulated_run():
    sizes = _sizes()
    runs = [
        simulate(
            sizes,
            _options(strategies=("static",), pipeline=PipelineModel(Pipeline(4), order=o)),
            progress=False,
        )
        for o in (False, True)
    ]
    for plain, ordered in zip(runs[0].results, runs[1].results, strict=True):
        assert np.all(ordered.step_s <= plain.step_s * (1 + 1e-12))


def test_the_model_is_validated():
    with pytest.raises(TypeError, match="pipeline"):
        PipelineModel(4)
    with pytest.raises(TypeError, match="order"):
        PipelineModel(Pipeline(4), order="yes")
    with pytest.raises(TypeError, match="pipeline"):
        _options(pipeline=Pipeline(4))


def test_cli_flags(capsys):
    args = ["--samples", "640", "--world", "4", "--config", "static", "--quiet", "--json", "-"]
    assert simulate_main([*args, "--pipeline-stages", "4", "--virtual-stages", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["options"]["pipeline"] == {
        "stages": 4,
        "virtual_stages": 2,
        "schedule": "interleaved",
        "backward_ratio": 2.0,
        "order": True,
    }
    assert simulate_main([*args, "--pipeline-stages", "0"]) == 2
    assert "--pipeline-stages" in capsys.readouterr().err
    assert simulate_main([*args, "--virtual-stages", "2"]) == 2
    assert "give --pipeline-stages S too" in capsys.readouterr().err
