"""The context-parallel benchmark's pieces: one step's figures are the planner's, one small
case reports consistent figures and renders (the gloo measurement is the benchmark's own)."""

from __future__ import annotations

import numpy as np

from benchmarks import context_parallel as bench
from chronica import plan_step


def test_step_figures_are_the_planners():
    lengths = np.clip(np.rint(np.random.default_rng(0).lognormal(6, 1.5, 64)), 1, 4096)
    lengths = lengths.astype(np.int64)
    out = bench.step_figures(lengths, 16, 4096)
    for g in bench.SIZES:
        plan = plan_step(lengths, 16, bench._packing(4096, g), cost=bench.COST)
        assert out[f"g{g}"]["figure"] == plan.rank_costs.max() / plan.rank_costs.mean()
        assert out[f"g{g}"]["figure"] >= out[f"g{g}"]["ideal"] - 1e-9
    assert out["g1"]["sharded"] == 0 and out["g1"]["figure"] >= out["bound"] - 1e-9
    assert out["g8"]["figure"] < out["g1"]["figure"]


def test_a_small_case_reports_and_renders(tmp_path):
    entry = bench._run_case(bench.Case("ln6-1.0", 16, 4096, 4), None, 1)
    assert set(entry["methods"]) == {f"g{g}" for g in bench.SIZES}
    result = {
        "mode": "quick",
        "seconds": 1.0,
        "machine": {"date_utc": "today"},
        "data_seed": bench.DATA_SEED,
        "cases": [entry],
        "planning": [
            {
                "data": "ln6-1.0",
                "g": 2,
                "worst": 0.05,
                "median": 0.04,
                "same_padding_worst": 0.05,
                "target": 0.1,
                "ok": True,
            }
        ],
        "comm": {
            "latency": 1e-5,
            "bandwidth": 1e9,
            "worst_error": 0.01,
            "ok": True,
            "points": [{"size": 2, "bytes": 1 << 20, "fastest": 1e-3, "model": 1e-3, "error": 0.0}],
        },
        "simulated": [
            {
                "devices": 16,
                "context_parallel": 1,
                "step_s": 1.0,
                "exchange_s": 0.0,
                "balance_mean": 2.0,
                "speedup": 1.0,
            }
        ],
    }
    assert entry["name"] in bench.format_table(result)
    page = bench.render_markdown(result, tmp_path)
    assert page.startswith("## Context parallelism") and entry["name"] in page
