"""The simulator's context-parallel model (``chronica.sim.context``,
``chronica simulate context-parallel``): the exchange's alpha-beta form (nothing without a
group or bytes, linear in the bytes, ``(g - 1) / g`` of them over the link, ``g - 1``
latencies), its fit recovering the parameters, the step's compute equal to the planner's
figures, the exchange added (all-gather) or overlapped (ring), and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chronica import CostModel, Packing, plan_step
from chronica.sim.cli import main
from chronica.sim.context import CommModel, simulate_context, step_seconds


def test_the_exchange_has_the_ring_all_gather_form():
    model = CommModel(latency=2e-6, bandwidth=5e9)
    assert model.seconds(1e6, 1) == 0.0 and model.seconds(0.0, 4) == 0.0
    for g in (2, 4, 8):
        one, two = model.seconds(1e6, g), model.seconds(2e6, g)
        assert two - one == pytest.approx((g - 1) / g * 1e6 / 5e9)
        assert 2 * one - two == pytest.approx((g - 1) * 2e-6)
    calls = CommModel(latency=0.0, bandwidth=1.0, kv_bytes=3.0, layers=4, passes=2)
    assert calls.micro_seconds(np.array([[10.0]]), 2).tolist() == [[8 * 0.5 * 30.0]]


def test_the_fit_recovers_latency_and_bandwidth():
    truth = CommModel(latency=3e-5, bandwidth=2e9)
    sizes = [2, 2, 2, 4, 4, 4]
    nbytes = [1e5, 1e6, 4e6, 1e5, 1e6, 4e6]
    fitted = CommModel.fit(
        sizes, nbytes, [truth.seconds(b, g) for g, b in zip(sizes, nbytes, strict=True)]
    )
    assert fitted.latency == pytest.approx(3e-5) and fitted.bandwidth == pytest.approx(2e9)
    with pytest.raises(ValueError, match="bandwidth"):
        CommModel.fit([2, 2], [1e5, 1e6], [1e-3, 1e-4])


def test_the_step_is_the_planners_compute_plus_or_overlapping_the_exchange():
    rng = np.random.default_rng(1)
    lengths = np.clip(np.rint(rng.lognormal(6, 1.5, 64)), 1, 4096).astype(np.int64)
    cost = CostModel(0.0, 24576.0, 1.0)
    free = CommModel(latency=0.0, bandwidth=1e30)
    today = plan_step(lengths, 16, Packing(max_tokens=4096), cost=cost)
    assert step_seconds(today, CommModel(), 1.0) == (today.rank_time, 0.0)
    plan = plan_step(
        lengths, 16, Packing(max_tokens=4096, context_parallel=4, pad_multiple=8), cost=cost
    )
    assert plan.sharded.any()
    assert step_seconds(plan, free, 1.0)[0] == pytest.approx(plan.rank_time)
    slow = CommModel(latency=1e-3, bandwidth=1e6)
    added, exchange = step_seconds(plan, slow, 1e-9)
    overlapped = step_seconds(plan, CommModel(latency=1e-3, bandwidth=1e6, algorithm="ring"), 1e-9)[
        0
    ]
    assert exchange > 0 and overlapped < added <= plan.rank_time * 1e-9 + exchange + 1e-12


def test_simulate_context_reports_the_planners_balance():
    steps = [np.array([4096, 64, 64, 64, 64, 64, 64, 64]), np.array([2048, 2048] + [32] * 6)]
    results = simulate_context(steps, 4, 4096, [1, 4], cost="quadratic")
    for lengths, balance in zip(steps, results[0].balance, strict=True):
        plan = plan_step(lengths, 4, Packing(max_tokens=4096), cost="quadratic")
        assert balance == plan.rank_costs.max() / plan.rank_costs.mean()
    assert results[1].balance.max() < results[0].balance.min()
    assert results[1].sharded.min() >= 1 and results[0].sharded.max() == 0


def test_the_command_line(tmp_path, capsys):
    out = tmp_path / "cp.json"
    args = ["context-parallel", "--world", "16", "--steps", "2", "--cp", "1,4", "--json", str(out)]
    assert main(args) == 0
    assert "speedup" in capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert [s["context_parallel"] for s in summary] == [1, 4]
    assert summary[1]["balance_mean"] < summary[0]["balance_mean"]
    assert main(["context-parallel", "--world", "6", "--cp", "4"]) == 2
    assert "multiple of context_parallel" in capsys.readouterr().err
