"""``chronica simulate`` with outlier delay (``packed,outliers=true``): the simulator plans
with ``Packing(outliers=OutlierDelay(...))`` and reports the planner's own figures."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core import CostModel, ScheduleConfig, Scheduler
from chronica.core.packing import Packing
from chronica.core.packing.outliers import OutlierDelay
from chronica.core.plan import delay_quantiles
from chronica.sim import ComputeModel, SimOptions, SizeDistribution, Strategy, simulate
from chronica.sim.cli import main as simulate_main
from chronica.sim.strategies import add_counts

COST = CostModel(0.0, 64.0, 1.0)


def _sizes() -> np.ndarray:
    return np.clip(SizeDistribution("lognormal", (5.0, 1.5)).draw(1200, 3), 1, 2048)


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_simulators_figures_are_the_planners(epochs: int) -> None:
    sizes = _sizes()
    spec = "packed,max_tokens=2048,outliers=true,max_delay=4,threshold=0.5"
    options = SimOptions(
        world=8, batch_size=32, cost=COST, epochs=epochs, compute=ComputeModel(1e-6),
        strategies=("torch", spec),
    )  # fmt: skip
    got = simulate(sizes, options, progress=False).result(spec)
    packing = Packing(max_tokens=2048, outliers=OutlierDelay(threshold=0.5, max_delay=4))
    scheduler = Scheduler(sizes, ScheduleConfig(8, batch_size=32, cost=COST, packing=packing))
    stats = [scheduler.stats(epoch) for epoch in range(epochs)]
    ratios = np.concatenate([_ratios(scheduler.plan_epoch(epoch).loads) for epoch in range(epochs)])
    assert got.load_ratio == pytest.approx(float(ratios.mean()), rel=1e-12)
    assert got.load_ratio_worst == pytest.approx(max(s.load_ratio_worst for s in stats), rel=1e-12)
    counts = np.zeros(0, np.int64)
    for s in stats:
        counts = add_counts(counts, s.delay_counts)
    assert got.delay == delay_quantiles(counts)
    assert got.delay["max"] <= 4 and got.delay["max"] > 0  # documents did wait, within bounds
    if epochs == 1:
        assert got.delay == stats[0].delay_quantiles
        assert got.load_ratio == pytest.approx(stats[0].load_ratio_mean, rel=1e-12)


def _ratios(loads: np.ndarray) -> np.ndarray:
    mean = loads.mean(axis=1)
    return loads.max(axis=1) / mean


def test_without_outliers_no_delay_is_reported() -> None:
    spec = "packed,max_tokens=2048"
    options = SimOptions(world=8, batch_size=32, cost=COST, strategies=(spec,))
    assert simulate(_sizes(), options, progress=False).result(spec).delay == {}


def test_outlier_options_parse_into_the_packing() -> None:
    config = Strategy.parse("packed,max_tokens=64,max_delay=3,max_queue=9").schedule_config(
        4, 16, 0, "linear", None
    )
    assert config.packing is not None
    assert config.packing.outliers == OutlierDelay(max_delay=3, max_queue=9)
    plain = Strategy.parse("packed,max_tokens=64,outliers=false").schedule_config(
        4, 16, 0, "linear", None
    )
    assert plain.packing is not None and plain.packing.outliers is None
    with pytest.raises(ValueError, match="need outliers=true"):
        Strategy.parse("packed,max_tokens=64,outliers=false,max_delay=3").schedule_config(
            4, 16, 0, "linear", None
        )
    with pytest.raises(ValueError, match="max_delay"):
        Strategy.parse("packed,max_tokens=64,max_delay=0").schedule_config(4, 16, 0, "linear", None)
    with pytest.raises(ValueError, match="static"):
        Strategy.parse("static,outliers=true").schedule_config(4, 16, 0, "linear", None)


def test_add_counts_pads_the_shorter() -> None:
    assert add_counts(np.array([5, 1]), (4, 0, 2)).tolist() == [9, 1, 2]
    assert add_counts(np.zeros(0, np.int64), ()).tolist() == []


def test_the_cli_prints_the_delay(capsys: pytest.CaptureFixture[str]) -> None:
    code = simulate_main(
        [
            "--world", "8", "--samples", "1200", "--dist", "lognormal:5:1.5",
            "--batch-size", "32", "--cost", "0,64,1",
            "--config", "packed,max_tokens=4096,long_documents=truncate,outliers=true",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "outlier delay" in out and "delay mean" in out
