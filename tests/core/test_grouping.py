"""Guided mode's step composition (``chronica.core.grouping``) against the numpy reference:
seeded jitter, runs of similar cost taken in the shuffled step order, the tail last."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica.core.grouping import grouped_by_size, jittered_costs
from chronica.core.rng import uniforms


@given(
    n=st.integers(0, 200), jitter=st.sampled_from([0.0, 0.1, 1.0]), key=st.integers(0, 2**64 - 1)
)
def test_jittered_costs_are_the_documented_product(n, jitter, key):
    rng = np.random.default_rng(n)
    costs = rng.random(300) * 10
    samples = rng.integers(0, 300, n)
    out = np.empty(n)
    jittered_costs(costs, samples, np.uint64(key), jitter, out)
    expected = costs[samples] * (1.0 + jitter * uniforms(n, np.uint64(key)))
    assert out.tobytes() == expected.tobytes()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 120),
    per_step=st.integers(1, 12),
    jitter=st.sampled_from([0.0, 0.2]),
    dtype=st.sampled_from([np.int32, np.int64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_grouped_by_size_equals_the_reference(n, per_step, jitter, dtype, seed):
    rng = np.random.default_rng(seed)
    costs = rng.choice([0.0, 1.0, 2.0, 7.5], 150) if seed % 2 else rng.random(150)
    stream = rng.permutation(150)[:n].astype(dtype)
    step_order = rng.permutation(n // per_step)
    got = grouped_by_size(costs, stream, np.uint64(seed), jitter, per_step, step_order)
    expect = reference.grouped_by_size(costs, stream, seed, jitter, per_step, step_order)
    assert got.dtype == dtype
    assert got.tolist() == expect.tolist()


def test_without_jitter_steps_hold_runs_of_the_sorted_costs_in_step_order():
    costs = np.array([5.0, 1.0, 4.0, 2.0, 6.0, 3.0, 0.5])
    got = grouped_by_size(costs, np.arange(7), np.uint64(1), 0.0, 2, np.array([2, 0, 1]))
    by_size = [4, 0, 2, 5, 3, 1, 6]  # descending cost
    assert got.tolist() == [*by_size[4:6], *by_size[0:2], *by_size[2:4], by_size[6]]


def test_equal_costs_keep_the_stream_order():
    stream = np.array([9, 3, 7, 1])
    got = grouped_by_size(np.ones(10), stream, np.uint64(0), 0.0, 2, np.array([0, 1]))
    assert got.tolist() == stream.tolist()


@pytest.mark.parametrize("key", [0, 2**63 + 5])
def test_every_sample_once_and_the_same_bytes_for_the_same_key(key):
    rng = np.random.default_rng(4)
    costs = rng.lognormal(3, 1, 500)
    stream = rng.permutation(500)
    order = rng.permutation(500 // 16)
    a = grouped_by_size(costs, stream, np.uint64(key), 0.3, 16, order)
    b = grouped_by_size(costs, stream, np.uint64(key), 0.3, 16, order)
    assert sorted(a.tolist()) == sorted(stream.tolist())
    assert a.tobytes() == b.tobytes()
    other = grouped_by_size(costs, stream, np.uint64(key + 1), 0.3, 16, order)
    assert other.tobytes() != a.tobytes()  # the jitter mixes similar samples between epochs
