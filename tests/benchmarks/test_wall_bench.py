"""The wall benchmark's pieces: every method's figures are the planner's on the steps that
method forms, and one small case reports and renders."""

from __future__ import annotations

import numpy as np

from benchmarks import outliers as peer
from benchmarks import wall as bench
from chronica import plan_step


def test_today_and_cp_figures_are_the_planners_on_the_epochs_steps():
    lengths = np.clip(np.rint(np.random.default_rng(0).lognormal(6, 1.5, 96)), 1, 4096)
    lengths = lengths.astype(np.int64)
    out = bench.epoch_figures(lengths, 16, 4096, 32)
    assert set(out) == {"bound"} | {k for k, _ in bench.METHODS if k != "wlb"}
    for key, g in (("today", 1), ("cp4", 4)):
        ratios = [
            plan.rank_costs.max() / plan.rank_costs.mean()
            for plan in (
                plan_step(lengths[s : s + 32], 16, bench._packing(4096, g), cost=bench.COST)
                for s in range(0, 96, 32)
            )
        ]
        assert out[key]["ratio_mean"] == np.mean(ratios)
        assert out[key]["ratio_worst"] == max(ratios)
    assert out["today"]["ratio_mean"] >= out["bound"] - 1e-9


def test_a_small_case_reports_and_renders(tmp_path):
    entry = bench._run_case(peer.Case("ln6-1.5", 16, 4096, 4), None, 3)
    assert set(entry["methods"]) == {k for k, _ in bench.METHODS}
    result = {
        "mode": "quick",
        "seconds": 1.0,
        "machine": {"date_utc": "today"},
        "cases": [entry, {"name": "lee-W16-4k-d4", "skipped": "no file"}],
    }
    assert entry["name"] in bench.format_table(result)
    page = bench.render_markdown(result, tmp_path)
    assert page.startswith("## The largest-document wall") and entry["name"] in page
    assert any(line.startswith("SKIP lee") for line in bench.check_targets(result))
