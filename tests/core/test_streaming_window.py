"""plan_window: a window's steps are the map-style kernel's plans of the same samples cut
in pool order; caps, equal counts, exactly-once with carry-over, the stream's end."""

import numpy as np
import pytest

from chronica.core.packing import Packing, plan_step, step_starts
from chronica.core.streaming import plan_window


def _lengths(n, seed=0, high=900):
    return np.random.default_rng(seed).integers(1, high, n)


@pytest.mark.parametrize("balance", ["rank", "micro"])
def test_every_step_is_the_map_style_plan_of_the_same_samples(balance):
    lengths = _lengths(70)
    packing = Packing(max_tokens=1024, balance=balance)
    plan = plan_window(np.arange(100, 170), lengths, 4, packing, batch_size=16)
    starts = step_starts(lengths, 16, None)
    assert len(plan.steps) == 4 and plan.carry.tolist() == list(range(64, 70))
    for step, a, b in zip(plan.steps, starts[:4], starts[1:5], strict=True):
        reference = plan_step(lengths[a:b], 4, packing)
        assert step.ids.tolist() == list(range(100 + a, 100 + b))
        assert np.array_equal(step.rank, reference.rank)
        assert np.array_equal(step.micro, reference.micro)
        assert step.num_micro == reference.num_micro
        for r in range(4):
            assert np.allclose(step.weights[r], reference.loss_weights(r))


def test_caps_equal_counts_and_exactly_once():
    lengths = _lengths(200, seed=3)
    packing = Packing(max_tokens=2048, row_length=1024, pad_multiple=8)
    plan = plan_window(np.arange(200), lengths, 3, packing, batch_size=30, final=True)
    seen = []
    for step in plan.steps:
        counts = {len(step.positions(r)) for r in range(3)}
        assert counts == {step.num_micro}
        for r in range(3):
            for cell in step.positions(r):
                assert packing.padded(step.lengths[cell]).sum() <= 2048
                seen.extend(step.ids[cell].tolist())
    assert sorted(seen) == list(range(200)) and plan.carry.size == 0


def test_a_final_tail_smaller_than_the_world_joins_the_step_before():
    plan = plan_window(np.arange(10), [5] * 10, 4, Packing(max_tokens=64), batch_size=8, final=True)
    assert [s.ids.shape[0] for s in plan.steps] == [10]


def test_a_stream_smaller_than_the_world_leaves_ranks_empty_with_equal_counts():
    plan = plan_window([3, 4], [5, 6], 4, Packing(max_tokens=64), batch_size=8, final=True)
    (step,) = plan.steps
    assert [len(step.positions(r)) for r in range(4)] == [step.num_micro] * 4
    assert sorted(
        np.concatenate([step.ids[p] for r in range(4) for p in step.positions(r)]).tolist()
    ) == [3, 4]
    assert np.isclose(step.weights.sum() / 4, 1.0)


def test_token_budget_cuts_steps_and_carries_the_open_one():
    lengths = _lengths(60, seed=5, high=300)
    packing = Packing(max_tokens=512, tokens_per_step=2000)
    plan = plan_window(np.arange(60), lengths, 2, packing)
    starts = step_starts(lengths, None, 2000)
    assert plan.carry.tolist() == list(range(starts[-2], 60))
    assert all(s.lengths.sum() <= 2000 for s in plan.steps)


def test_deterministic_and_checked():
    lengths = _lengths(40)
    a = plan_window(np.arange(40), lengths, 2, Packing(max_tokens=1024), batch_size=8)
    b = plan_window(np.arange(40), lengths, 2, Packing(max_tokens=1024), batch_size=8)
    assert all(
        np.array_equal(x.rank, y.rank) and np.array_equal(x.micro, y.micro)
        for x, y in zip(a.steps, b.steps, strict=True)
    )
    assert "WindowPlan(steps=5" in repr(a) and "WindowStep(" in repr(a.steps[0])
    with pytest.raises(TypeError, match="packing"):
        plan_window([1], [1], 1, {"max_tokens": 4}, batch_size=1)
    with pytest.raises(ValueError, match="as many"):
        plan_window([1, 2], [1], 1, Packing(max_tokens=4), batch_size=1)
    with pytest.raises(TypeError, match="batch_size"):
        plan_window([1], [1], 1, Packing(max_tokens=4))
