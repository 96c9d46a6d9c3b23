"""``chronica.core.pipeline``: the options validate and show themselves, the count rules,
the makespan against the pure-Python reference and the closed forms of equal costs, the
bounds, and the micro-batch order (a permutation, deterministic, never worse than the
given, ascending or descending order)."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_reference import reference_makespan

from chronica.core.pipeline import (
    Pipeline,
    equal_cost_bound,
    makespan_lower_bound,
    order_micro_batches,
    pipeline_makespan,
)

EPS = 1e-9


@st.composite
def plans(draw, largest: int = 40):
    schedule = draw(st.sampled_from(["1f1b", "interleaved", "zero_bubble"]))
    stages = draw(st.integers(1, 8))
    virtual = draw(st.integers(2, 4)) if schedule == "interleaved" else 1
    pipe = Pipeline(stages, virtual, schedule, draw(st.sampled_from([1.0, 2.0, 3.0])))
    step = pipe.micro_batch_multiple
    micro = draw(st.integers(1, max(1, largest // step))) * step
    spread = draw(st.sampled_from([0.0, 0.2, 1.0]))
    seed = draw(st.integers(0, 2**16))
    costs = np.random.default_rng(seed).lognormal(0.0, spread, micro) if spread else np.ones(micro)
    return pipe, costs


# -- the options -------------------------------------------------------------------------------


def test_defaults_and_repr():
    assert Pipeline(4).schedule == "1f1b"
    assert Pipeline(4, 2).schedule == "interleaved"
    assert repr(Pipeline(4)) == "Pipeline(stages=4)"
    assert repr(Pipeline(4, 2)) == "Pipeline(stages=4, virtual_stages=2)"
    assert repr(Pipeline(8, schedule="zero_bubble", backward_ratio=3.0)) == (
        "Pipeline(stages=8, schedule='zero_bubble', backward_ratio=3.0)"
    )
    assert Pipeline(4, schedule="1f1b") == Pipeline(4)
    assert Pipeline(4, 2).to_tuple() == (4, 2, "interleaved", 2.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"stages": 0}, ValueError, "stages"),
        ({"stages": 2.0}, TypeError, "stages"),
        ({"stages": True}, TypeError, "stages"),
        ({"stages": 2, "virtual_stages": 0}, ValueError, "virtual_stages"),
        ({"stages": 2, "virtual_stages": "2"}, TypeError, "virtual_stages"),
        ({"stages": 2, "schedule": "gpipe"}, ValueError, "schedule"),
        ({"stages": 2, "schedule": 1}, TypeError, "schedule"),
        ({"stages": 2, "schedule": "interleaved"}, ValueError, "virtual_stages"),
        ({"stages": 2, "virtual_stages": 2, "schedule": "1f1b"}, ValueError, "interleaved"),
        ({"stages": 2, "backward_ratio": 0.0}, ValueError, "backward_ratio"),
        ({"stages": 2, "backward_ratio": float("inf")}, ValueError, "backward_ratio"),
        ({"stages": 2, "backward_ratio": "2"}, TypeError, "backward_ratio"),
    ],
)
def test_a_wrong_field_is_named(kwargs, error, field):
    with pytest.raises(error, match=field):
        Pipeline(**kwargs)


def test_the_count_rules():
    assert (Pipeline(4).micro_batch_multiple, Pipeline(4).min_micro_batches) == (1, 4)
    assert (Pipeline(4, 2).micro_batch_multiple, Pipeline(4, 2).min_micro_batches) == (4, 4)
    assert [Pipeline(4).micro_batch_count(n) for n in (1, 4, 5)] == [4, 4, 5]
    assert [Pipeline(4, 2).micro_batch_count(n) for n in (1, 5, 8, 9)] == [4, 8, 8, 12]
    with pytest.raises(ValueError, match="at_least"):
        Pipeline(4).micro_batch_count(0)


def test_a_count_against_the_rule_names_the_fix():
    with pytest.raises(ValueError, match=r"multiple of 4; plan 8 \(Pipeline.micro_batch_count\)"):
        pipeline_makespan(np.ones(6), Pipeline(4, 2))


@pytest.mark.parametrize("costs", [[], [[1.0]], [1.0, -1.0], [1.0, float("nan")]])
def test_bad_costs_are_refused(costs):
    with pytest.raises(ValueError, match="costs"):
        pipeline_makespan(costs, Pipeline(2))


def test_a_pipeline_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError, match="pipeline"):
        pipeline_makespan([1.0], 2)


# -- the makespan and the bounds ---------------------------------------------------------------


@settings(max_examples=100)
@given(plans(largest=16))
def test_the_makespan_is_the_reference(plan):
    pipe, costs = plan
    want = reference_makespan(
        list(costs), pipe.stages, pipe.virtual_stages, pipe.schedule, pipe.backward_ratio
    )
    assert pipeline_makespan(costs, pipe) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("stages", [1, 2, 4, 8])
@pytest.mark.parametrize("virtual", [1, 2, 3])
@pytest.mark.parametrize("groups", [1, 2, 5])
def test_equal_costs_give_the_closed_forms(stages, virtual, groups):
    micro = stages * groups
    costs = np.full(micro, 3.0)
    if virtual == 1:
        want = (micro + stages - 1) * 3.0 / stages
        assert pipeline_makespan(costs, Pipeline(stages)) == pytest.approx(want)
        # Zero-bubble: a bubble of (S - 1)·(F + B - W) = (S - 1)·F with F = B = W.
        zb = (micro + (stages - 1) / 3) * 3.0 / stages
        assert pipeline_makespan(costs, Pipeline(stages, schedule="zero_bubble")) == (
            pytest.approx(zb)
        )
    else:
        want = (micro + (stages - 1) / virtual) * 3.0 / stages
        assert pipeline_makespan(costs, Pipeline(stages, virtual)) == pytest.approx(want)
    pipe = Pipeline(stages, virtual)
    assert equal_cost_bound(costs, pipe) == pytest.approx(pipeline_makespan(costs, pipe))
    if pipe.schedule != "zero_bubble":
        assert makespan_lower_bound(costs, pipe) == pytest.approx(equal_cost_bound(costs, pipe))


@given(plans())
def test_no_order_beats_the_lower_bound(plan):
    pipe, costs = plan
    lower = makespan_lower_bound(costs, pipe)
    assert pipeline_makespan(costs, pipe) >= lower * (1 - EPS)
    assert pipeline_makespan(costs[order_micro_batches(costs, pipe)], pipe) >= lower * (1 - EPS)
    assert equal_cost_bound(costs, pipe) == pytest.approx(
        pipeline_makespan(np.full(costs.shape[0], costs.mean()), pipe)
    )


def test_the_makespan_is_at_least_a_device_share_and_scales_with_the_costs():
    pipe = Pipeline(4, 2)
    costs = np.random.default_rng(3).lognormal(0, 1, 12)
    assert pipeline_makespan(costs, pipe) >= costs.sum() / 4
    assert pipeline_makespan(2 * costs, pipe) == pytest.approx(2 * pipeline_makespan(costs, pipe))


# -- the order ---------------------------------------------------------------------------------


@given(plans())
def test_the_order_is_a_permutation_no_worse_than_the_simple_orders(plan):
    pipe, costs = plan
    order = order_micro_batches(costs, pipe)
    assert order.dtype == np.int64
    assert sorted(order.tolist()) == list(range(costs.shape[0]))
    ordered = pipeline_makespan(costs[order], pipe)
    up = np.argsort(costs, kind="stable")
    for other in (np.arange(costs.shape[0]), up, up[::-1]):
        assert ordered <= pipeline_makespan(costs[other], pipe) * (1 + EPS)


def test_the_order_is_deterministic_and_bounded_by_its_budget():
    pipe = Pipeline(8)
    costs = np.random.default_rng(7).lognormal(0, 0.5, 64)
    first = order_micro_batches(costs, pipe)
    assert np.array_equal(first, order_micro_batches(costs.copy(), pipe))
    # The smallest budget only picks among the starting orders.
    cheap = order_micro_batches(costs, pipe, budget=1)
    assert pipeline_makespan(costs[first], pipe) <= pipeline_makespan(costs[cheap], pipe)
    with pytest.raises(ValueError, match="budget"):
        order_micro_batches(costs, pipe, budget=0)


def test_cheap_micro_batches_fill_the_pipeline():
    pipe = Pipeline(4)
    costs = np.array([4.0, 4.0, 4.0, 4.0, 1.0, 1.0])
    order = order_micro_batches(costs, pipe)
    assert costs[order[0]] == 1.0
    assert pipeline_makespan(costs[order], pipe) < pipeline_makespan(costs, pipe)


@settings(max_examples=30)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**16))
def test_few_micro_batches_get_the_best_order_of_all(stages, micro, seed):
    """With M! simulations within the budget, every order is tried."""
    pipe = Pipeline(stages)
    costs = np.random.default_rng(seed).lognormal(0.0, 1.0, micro)
    best = min(pipeline_makespan(costs[list(p)], pipe) for p in permutations(range(micro)))
    assert pipeline_makespan(costs[order_micro_batches(costs, pipe)], pipe) == pytest.approx(best)
