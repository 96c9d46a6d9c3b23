import numpy as np
import pytest
import reference
from hypothesis import given
from hypothesis import strategies as st

from chronica.core.pool import fill_slack, lpt_bins


def _ratios(loads):
    return loads.max(axis=1) / loads.mean(axis=1)


def _grouped_bins(costs, steps, ranks):
    members, loads = lpt_bins(costs, costs, steps * ranks)
    grouped = np.argsort(-loads, kind="stable").reshape(steps, ranks)
    return members[grouped], loads[grouped]


@pytest.mark.parametrize("seed", range(4))
def test_fill_slack_equals_reference(seed):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(3, 1, 6 * 4 * 5)
    costs[rng.choice(costs.size, 2, replace=False)] *= 30
    members, loads = _grouped_bins(costs, 6, 4)
    nested = [[sorted(b.tolist()) for b in step] for step in members]
    fill_slack(costs, members, loads)
    reference.fill_slack(costs, nested)
    got = [[sorted(b.tolist()) for b in step] for step in members]
    assert got == [[sorted(b) for b in step] for step in nested]


@given(
    steps=st.integers(1, 8), ranks=st.integers(1, 6), k=st.integers(1, 6), seed=st.integers(0, 99)
)
def test_fill_slack_keeps_counts_and_never_raises_the_worst_step(steps, ranks, k, seed):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(3, 1.5, steps * ranks * k)
    members, loads = _grouped_bins(costs, steps, ranks)
    before_worst = _ratios(loads).max()
    before_total = loads.max(axis=1).sum()
    fill_slack(costs, members, loads)
    assert np.array_equal(np.sort(members.ravel()), np.arange(costs.size))
    np.testing.assert_allclose(loads, costs[members].sum(axis=2), rtol=1e-9)
    assert _ratios(loads).max() <= before_worst * (1 + 1e-9)
    assert loads.max(axis=1).sum() <= before_total * (1 + 1e-9)


def test_fill_slack_spreads_a_huge_sample():
    rng = np.random.default_rng(7)
    costs = rng.lognormal(5, 1, 64 * 8 * 32)
    costs[:3] = np.median(costs) * 400
    members, loads = _grouped_bins(costs, 64, 8)
    assert _ratios(loads).max() > 1.5
    fill_slack(costs, members, loads)
    assert _ratios(loads).max() < 1.01


def test_lpt_bins_fill_equal_counts_with_lpt_order():
    rng = np.random.default_rng(3)
    costs = rng.lognormal(3, 1, 60)
    members, loads = lpt_bins(costs, costs, 6)
    expect = reference.lpt(costs, 6)
    assert [list(m) for m in members] == expect
    np.testing.assert_allclose(loads, [costs[m].sum() for m in members])
    with pytest.raises(ValueError, match="bins"):
        lpt_bins(costs, costs, 7)
