"""``chronica.core.balance.balance_steps`` against its pure-Python reference: equal counts,
torch's strided split for equal costs, speeds and unequal counts, threads, gathered costs."""

import numpy as np
import pytest
import reference
from hypothesis import given
from hypothesis import strategies as st

from chronica.core.balance import balance_steps


def _split(perm, starts, s, r, w):
    k = (starts[s + 1] - starts[s]) // w
    return perm[starts[s] + r * k : starts[s] + (r + 1) * k]


@pytest.mark.parametrize("w,k", [(2, 3), (4, 8), (8, 32), (5, 7)])
@pytest.mark.parametrize("dist", ["lognormal", "uniform", "heavy"])
def test_kernel_equals_reference(w, k, dist):
    rng = np.random.default_rng(w * 100 + k)
    n = w * k
    costs = {
        "lognormal": rng.lognormal(5, 1, 3 * n),
        "uniform": rng.uniform(1, 2, 3 * n),
        "heavy": np.where(rng.random(3 * n) < 0.05, 1000.0, 1.0) + rng.random(3 * n),
    }[dist]
    starts = np.array([0, n, 2 * n, 3 * n])
    perm, loads = balance_steps(costs, starts, w)
    for s in range(3):
        expect = reference.balance_step(costs[starts[s] : starts[s + 1]], w)
        for r in range(w):
            got = _split(perm, starts, s, r, w) - starts[s]
            assert got.tolist() == expect[r]
            assert loads[s, r] == pytest.approx(costs[starts[s] + got].sum())


@given(
    w=st.integers(1, 9),
    ks=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    data=st.data(),
)
def test_every_step_is_split_into_equal_counts(w, ks, data):
    lengths = [w * k for k in ks]
    n = sum(lengths)
    costs = np.array(
        data.draw(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=n, max_size=n))
    )
    starts = np.concatenate([[0], np.cumsum(lengths)])
    perm, loads = balance_steps(costs, starts, w)
    assert np.array_equal(np.sort(perm), np.arange(n))
    for s, k in enumerate(ks):
        block = perm[starts[s] : starts[s + 1]]
        assert set(block.tolist()) == set(range(starts[s], starts[s + 1]))
        for r in range(w):
            part = block[r * k : (r + 1) * k]
            assert np.all(np.diff(part) > 0)
            assert loads[s, r] == pytest.approx(costs[part].sum(), rel=1e-9, abs=1e-9)
        # Never worse than plain LPT, never better than the bound.
        lpt_top = max(
            costs[starts[s] + np.array(m)].sum()
            for m in reference.lpt(costs[starts[s] : starts[s + 1]], w)
        )
        assert loads[s].max() <= lpt_top * (1 + 1e-9) + 1e-9
        bound = reference.lower_bound(costs[starts[s] : starts[s + 1]], w)
        assert loads[s].max() >= bound * (1 - 1e-9) - 1e-9


def test_equal_costs_give_torch_strided_split():
    w, k = 4, 5
    perm, _ = balance_steps(np.ones(w * k), np.array([0, w * k]), w)
    for r in range(w):
        assert perm[r * k : (r + 1) * k].tolist() == list(range(r, w * k, w))


def test_thread_count_does_not_change_the_result():
    rng = np.random.default_rng(1)
    costs = rng.lognormal(5, 1, 64 * 40)
    starts = np.arange(0, 64 * 40 + 1, 64)
    one = balance_steps(costs, starts, 8, threads=1)
    three = balance_steps(costs, starts, 8, threads=3)
    np.testing.assert_array_equal(one[0], three[0])
    np.testing.assert_array_equal(one[1], three[1])


def test_refinement_only_starts_from_given_blocks_and_improves():
    rng = np.random.default_rng(2)
    costs = rng.lognormal(3, 1, 64)
    starts = np.array([0, 64])
    before = costs.reshape(8, 8).sum(axis=1).max()
    perm, loads = balance_steps(costs, starts, 8, use_lpt=False)
    assert np.array_equal(np.sort(perm), np.arange(64))
    assert loads.max() <= before


@pytest.mark.parametrize("w", [2, 4, 7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speed_aware_kernel_with_unequal_counts_equals_reference(w, seed):
    rng = np.random.default_rng(seed * 10 + w)
    caps = rng.integers(0, 9, size=(3, w))
    caps[:, 0] += 1  # every step has at least one sample
    alpha = rng.uniform(0, 50, w)
    beta = rng.uniform(0.2, 3, w)
    lengths = caps.sum(axis=1)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    costs = rng.lognormal(4, 1, starts[-1])
    perm, loads = balance_steps(costs, starts, w, counts=caps, alpha=alpha, beta=beta)
    assert np.array_equal(np.sort(perm), np.arange(starts[-1]))
    for s in range(3):
        step = costs[starts[s] : starts[s + 1]]
        expect = reference.balance_step(step, w, 4, caps[s], alpha, beta)
        offsets = np.concatenate([[0], np.cumsum(caps[s])]) + starts[s]
        for r in range(w):
            got = perm[offsets[r] : offsets[r + 1]] - starts[s]
            assert got.tolist() == expect[r]
            assert loads[s, r] == pytest.approx(step[got].sum())


def test_slow_ranks_get_lighter_samples_and_times_even_out():
    rng = np.random.default_rng(3)
    w, k, steps = 4, 32, 20
    costs = rng.lognormal(5, 1, w * k * steps)
    starts = np.arange(0, costs.shape[0] + 1, w * k)
    beta = np.array([1.0, 1.0, 2.0, 1.0])  # rank 2 takes twice as long per unit of cost
    _, plain = balance_steps(costs, starts, w)
    _, aware = balance_steps(costs, starts, w, beta=beta)
    plain_times, aware_times = plain * beta, aware * beta
    assert (aware[:, 2] < aware[:, [0, 1, 3]].min(axis=1)).all()
    assert (aware_times.max(axis=1) <= plain_times.max(axis=1) * (1 + 1e-9)).all()
    assert np.median(aware_times.max(axis=1) / aware_times.min(axis=1)) < 1.05


def test_counts_must_add_up_to_each_step():
    with pytest.raises(ValueError, match="add up"):
        balance_steps(np.ones(8), np.array([0, 8]), 2, counts=np.array([[3, 4]]))


def test_gathered_costs_give_the_same_split_as_costs_in_order():
    rng = np.random.default_rng(4)
    costs = rng.lognormal(4, 1, 5000)
    index = rng.permutation(5000)[:4096].astype(np.int32)
    starts = np.arange(0, 4097, 512)
    perm, loads = balance_steps(costs[index], starts, 8)
    got, got_loads = balance_steps(costs, starts, 8, index=index)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, index[perm])
    np.testing.assert_array_equal(got_loads, loads)
