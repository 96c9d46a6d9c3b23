"""chronica.runtime.padding.step_longest against a per-step loop: real plans, empty steps and
several features."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core import ScheduleConfig, Scheduler, as_cost_model, as_shuffle_policy
from chronica.core.plan import EpochPlan
from chronica.runtime.padding import step_longest


def loop(plan: EpochPlan, lengths: np.ndarray) -> np.ndarray:
    rows = []
    for s in range(plan.num_steps):
        everyone = np.concatenate([plan.local(s, r) for r in range(plan.num_replicas)])
        rows.append(lengths[everyone].max(axis=0) if len(everyone) else 0 * lengths[0])
    return np.array(rows, dtype=np.int64)


@pytest.mark.parametrize("n,world,batch", [(53, 2, 8), (96, 4, 16), (7, 3, 3)])
def test_step_longest_is_the_longest_sample_of_every_step_over_all_ranks(n, world, batch):
    rng = np.random.default_rng(n)
    config = ScheduleConfig(
        num_replicas=world,
        batch_size=batch,
        shuffle=as_shuffle_policy(True),
        cost=as_cost_model(None),
    )
    sizes = rng.integers(1, 50, size=n)
    plan = Scheduler(sizes, config).plan_epoch(1)
    np.testing.assert_array_equal(step_longest(plan, sizes), loop(plan, sizes))
    two = np.stack([sizes, rng.integers(0, 9, size=n)], axis=1)
    np.testing.assert_array_equal(step_longest(plan, two), loop(plan, two))


def test_empty_steps_pad_to_zero():
    # Steps 1 and 3 hold no sample; steps are contiguous in indices.
    bounds = np.array([[0, 1, 2], [2, 2, 2], [2, 3, 5], [5, 5, 5]])
    plan = EpochPlan(
        epoch=0,
        num_replicas=2,
        indices=np.array([0, 1, 2, 3, 4]),
        bounds=bounds,
        loads=np.zeros((4, 2)),
        num_padded=0,
        num_dropped=0,
        digest="",
    )
    lengths = np.array([3, 9, 4, 1, 7])
    np.testing.assert_array_equal(step_longest(plan, lengths), [9, 0, 7, 0])
    with pytest.raises(ValueError, match="lengths"):
        step_longest(plan, np.zeros((5, 1, 1)))
