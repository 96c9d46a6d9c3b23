"""The shared numba kernels (``chronica.core.kernels``) against numpy and the pure-Python
references of ``tests/helpers/reference.py``: radix argsort, descending keys, winner trees,
the lightest leaves and capacity-bounded LPT."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from hypothesis import given
from hypothesis import strategies as st

from chronica.core.kernels import (
    argsort_descending,
    descending_keys,
    lpt,
    radix_argsort_into,
    smallest_leaves,
    tree_set,
    winner_tree,
)

nonnegative = st.floats(0.0, 1e12, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("spread", [1, 200, 1 << 16, 1 << 32])
def test_radix_argsort_is_numpys_stable_argsort(dtype, spread):
    rng = np.random.default_rng(spread % 97)
    keys = (rng.integers(0, spread, 3000, dtype=np.uint64) * 0x01000001 % (1 << 32)).astype(
        np.uint32
    )
    n = keys.shape[0]
    buffers = (np.empty(n, np.uint32), np.empty(n, dtype), np.empty(n, dtype))
    got = radix_argsort_into(keys.copy(), buffers[0], buffers[1], buffers[2])
    assert got.tolist() == np.argsort(keys, kind="stable").tolist()


@given(st.lists(st.integers(0, 2**64 - 1), max_size=300))
def test_radix_argsort_of_64_bit_keys_is_numpys_stable_argsort(values):
    keys = np.array(values, dtype=np.uint64)
    n = keys.shape[0]
    got = radix_argsort_into(
        keys.copy(), np.empty(n, np.uint64), np.empty(n, np.int64), np.empty(n, np.int64)
    )
    assert got.tolist() == np.argsort(keys, kind="stable").tolist()


@given(st.lists(st.one_of(nonnegative, st.sampled_from([0.0, 1.0, 2.0])), max_size=300))
def test_descending_keys_and_argsort_match_the_reference(values):
    costs = np.array(values, dtype=np.float64)
    keys = np.empty(costs.shape[0], np.uint32)
    descending_keys(costs, keys)
    expected = reference.descending_order(costs)
    assert np.argsort(keys, kind="stable").tolist() == expected.tolist()
    assert argsort_descending(costs).tolist() == expected.tolist()


def test_argsort_descending_keeps_position_order_for_near_equal_values():
    # Within 2**-20 relative the top 32 bits agree: position order decides.
    costs = np.array([1.0, 2.0, 1.0 + 2.0**-40, 2.0])
    assert argsort_descending(costs).tolist() == [1, 3, 0, 2]


@given(
    values=st.lists(
        st.one_of(st.sampled_from([0.0, 1.0, 2.0, np.inf]), st.floats(-5, 5)),
        min_size=1,
        max_size=40,
    ),
    count=st.integers(0, 6),
    updates=st.lists(st.tuples(st.integers(0, 39), st.sampled_from([0.0, 1.0, 3.0, np.inf]))),
    data=st.data(),
)
def test_winner_tree_gives_the_first_smallest_like_the_reference(values, count, updates, data):
    keys = np.array(values)
    value, where = winner_tree(keys)
    for i, key in updates:
        if i < keys.shape[0]:
            keys[i] = key
            tree_set(value, where, i, key)
        if np.isfinite(keys).any():
            assert where[1] == int(np.argmin(keys))
    exclude = data.draw(st.integers(-1, keys.shape[0] - 1))
    before = (value.copy(), where.copy())
    buffers = (np.empty(count, np.int64), np.empty(count + 1, np.int64), np.empty(count + 1))
    assert smallest_leaves(value, where, exclude, *buffers).tolist() == reference.smallest(
        keys.tolist(), count, exclude
    )
    np.testing.assert_array_equal(value, before[0])  # put back as it was
    np.testing.assert_array_equal(where, before[1])


def test_a_winner_tree_pads_to_a_power_of_two_with_inf():
    value, where = winner_tree(np.array([4.0, 2.0, 3.0]))
    assert value.shape == (8,) and value[4 + 3] == np.inf
    assert (value[1], where[1]) == (2.0, 1)


@given(
    costs=st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5, 10.0]) | nonnegative, max_size=60),
    w=st.integers(1, 6),
    data=st.data(),
)
def test_lpt_matches_the_reference_with_capacities_and_speeds(costs, w, data):
    costs = np.array(costs, dtype=np.float64)
    n = costs.shape[0]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=w - 1, max_size=w - 1)))
    caps = np.diff([0, *cuts, n]).astype(np.int64)
    alpha = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 2.0]), min_size=w, max_size=w)))
    beta = np.array(data.draw(st.lists(st.sampled_from([0.5, 1.0, 3.0]), min_size=w, max_size=w)))
    order = argsort_descending(costs)
    members = np.full((w, max(int(caps.max()), 1)), -1, np.int64)
    loads = np.empty(w)
    lpt(costs[order], order, members, caps, alpha, beta, loads)
    expected = reference.lpt(costs, w, caps, alpha, beta)
    assert [members[r, : caps[r]].tolist() for r in range(w)] == expected
    for r in range(w):
        assert loads[r] == pytest.approx(costs[expected[r]].sum())


def test_lpt_with_equal_costs_deals_round_robin():
    # Equal costs, equal speeds: every sample to the lowest rank with the least load.
    members, loads = np.empty((3, 2), np.int64), np.empty(3)
    order = np.arange(6)
    lpt(np.ones(6), order, members, np.full(3, 2), np.zeros(3), np.ones(3), loads)
    assert members.tolist() == [[0, 3], [1, 4], [2, 5]]
    assert loads.tolist() == [2.0, 2.0, 2.0]
