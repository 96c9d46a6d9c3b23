import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.pool import fill_slack, lpt_bins, pool_steps


def _ratios(loads):
    return loads.max(axis=1) / loads.mean(axis=1)


def _grouped_bins(costs, steps, ranks):
    members, member_costs, loads = lpt_bins(costs, steps * ranks)
    grouped = np.argsort(-loads, kind="stable").reshape(steps, ranks)
    return members[grouped], member_costs[grouped], loads[grouped]


@pytest.mark.parametrize("rounds", [False, True])
@pytest.mark.parametrize("jitter", [0.0, 0.1])
def test_lpt_bins_equal_reference(jitter, rounds):
    rng = np.random.default_rng(3)
    costs = np.round(rng.lognormal(3, 1, 96))  # integer sizes: ties between samples and bins
    members, member_costs, loads = lpt_bins(costs, 8, key=11, jitter=jitter, rounds=rounds)
    expect = reference.pool_bins(costs, 8, key=11, jitter=jitter, rounds=rounds)
    assert members.dtype == np.int32
    assert members.tolist() == expect
    np.testing.assert_array_equal(member_costs, costs[members])
    np.testing.assert_array_equal(loads, [sum(costs[i] for i in b) for b in expect])


def test_lpt_bins_refuses_counts_that_do_not_divide():
    with pytest.raises(ValueError, match="do not fill 7 bins"):
        lpt_bins(np.ones(60), 7)
    with pytest.raises(ValueError, match="samples must hold one sample number per cost"):
        pool_steps(np.ones(60), np.arange(59), 6, np.arange(2))


@pytest.mark.parametrize("seed", range(4))
def test_fill_slack_equals_reference(seed):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(3, 1, 6 * 4 * 5)
    costs[rng.choice(costs.size, 2, replace=False)] *= 30
    members, member_costs, loads = _grouped_bins(costs, 6, 4)
    nested = [[b.tolist() for b in step] for step in members]
    fill_slack(member_costs, members, loads)
    reference.fill_slack(costs, nested)
    assert [[b.tolist() for b in step] for step in members] == [
        [sorted(b, key=lambda i: (costs[i], i)) for b in step] for step in nested
    ]
    np.testing.assert_array_equal(member_costs, costs[members])


def test_fill_slack_refuses_mismatched_shapes():
    members, member_costs, loads = _grouped_bins(np.ones(24), 3, 4)
    with pytest.raises(ValueError, match="member_costs must have members' shape"):
        fill_slack(member_costs[:, :2], members, loads)


@given(
    steps=st.integers(1, 8), ranks=st.integers(1, 6), k=st.integers(1, 6), seed=st.integers(0, 99)
)
def test_fill_slack_keeps_counts_and_never_raises_the_worst_step(steps, ranks, k, seed):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(3, 1.5, steps * ranks * k)
    members, member_costs, loads = _grouped_bins(costs, steps, ranks)
    before_worst = _ratios(loads).max()
    before_total = loads.max(axis=1).sum()
    fill_slack(member_costs, members, loads)
    assert np.array_equal(np.sort(members.ravel()), np.arange(costs.size))
    np.testing.assert_array_equal(member_costs, costs[members])
    np.testing.assert_allclose(loads, costs[members].sum(axis=2), rtol=1e-9)
    assert _ratios(loads).max() <= before_worst * (1 + 1e-9)
    assert loads.max(axis=1).sum() <= before_total * (1 + 1e-9)


def test_fill_slack_spreads_a_huge_sample():
    rng = np.random.default_rng(7)
    costs = rng.lognormal(5, 1, 64 * 8 * 32)
    costs[:3] = np.median(costs) * 400
    members, member_costs, loads = _grouped_bins(costs, 64, 8)
    assert _ratios(loads).max() > 1.5
    fill_slack(member_costs, members, loads)
    assert _ratios(loads).max() < 1.01


@pytest.mark.parametrize("rounds", [False, True])
@pytest.mark.parametrize(
    ("steps", "ranks", "k", "seed"), [(5, 4, 6, 0), (7, 3, 4, 1), (4, 8, 3, 2)]
)
def test_pool_steps_equal_reference(steps, ranks, k, seed, rounds):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(4, 1, steps * ranks * k)
    costs[rng.choice(costs.size, 2, replace=False)] *= 25
    samples = rng.permutation(costs.size * 2)[: costs.size]
    step_order = rng.permutation(steps)
    indices, loads = pool_steps(costs, samples, ranks, step_order, key=5, jitter=0.1, rounds=rounds)
    expect, expect_loads = reference.pool_steps(costs, samples, ranks, step_order, 5, 0.1, rounds)
    got = indices.reshape(steps, ranks, k)
    assert [[sorted(r) for r in step] for step in got.tolist()] == expect
    np.testing.assert_allclose(loads, expect_loads, rtol=1e-12)
    # Every rank's samples in the order of the step's bins, each bin by ascending cost.
    by_sample = dict(zip(samples.tolist(), costs.tolist(), strict=True))
    rank_costs = np.vectorize(by_sample.get)(got)
    np.testing.assert_allclose(loads, rank_costs.sum(axis=2), rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    steps=st.integers(1, 6), ranks=st.integers(1, 5), k=st.integers(1, 5), seed=st.integers(0, 99)
)
def test_pool_steps_cover_every_sample_once_and_beat_lpt_alone(steps, ranks, k, seed):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(3, 1.5, steps * ranks * k)
    samples = np.arange(costs.size)
    indices, loads = pool_steps(costs, samples, ranks, np.arange(steps))
    assert np.array_equal(np.sort(indices), samples)
    np.testing.assert_allclose(loads, costs[indices].reshape(steps, ranks, k).sum(axis=2))
    _, _, lpt_loads = _grouped_bins(costs, steps, ranks)
    assert loads.max(axis=1).sum() <= lpt_loads.max(axis=1).sum() * (1 + 1e-9)


@pytest.mark.parametrize("rounds", [False, True])
def test_pool_steps_do_not_depend_on_the_thread_count(rounds):
    rng = np.random.default_rng(4)
    costs = rng.lognormal(5, 1, 24 * 16 * 8)
    costs[:5] *= 50
    samples = rng.permutation(costs.size)
    order = rng.permutation(24)
    one = pool_steps(costs, samples, 16, order, key=3, jitter=0.1, threads=1, rounds=rounds)
    three = pool_steps(costs, samples, 16, order, key=3, jitter=0.1, threads=3, rounds=rounds)
    np.testing.assert_array_equal(one[0], three[0])
    np.testing.assert_array_equal(one[1], three[1])


def test_scheduler_plans_in_rounds_above_the_bin_threshold_deterministically():
    from chronica.core import ScheduleConfig, Scheduler
    from chronica.core.pool import ROUNDS_ABOVE_BINS

    sizes = np.random.default_rng(9).lognormal(5, 1, 64 * 600 + 17)
    config = ScheduleConfig(64, 64, exact=False, seed=2)
    assert 600 * 64 > ROUNDS_ABOVE_BINS  # one sample per bin, 600 full steps of 64 bins
    first, again = (Scheduler(sizes, config).plan_epoch(1) for _ in range(2))
    np.testing.assert_array_equal(first.indices, again.indices)
    np.testing.assert_array_equal(first.loads, again.loads)
    assert np.array_equal(np.unique(first.indices), np.arange(sizes.size))
    assert np.all(np.diff(first.bounds, axis=1) == np.diff(first.bounds, axis=1)[:, :1])
