"""Plan data (``chronica.core.plan``) built by hand: views of every (step, rank), counts and
loss weights, windows counted from the epoch's start, micro-batch numbering and weights, and
the balance and padding statistics against figures worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.core.plan import EpochPlan, MicroLayout, PlanStats, WindowPlan

# Two steps, two ranks: step 0 gives rank 0 samples [3, 1] and rank 1 [0]; step 1 gives
# rank 0 [2] and rank 1 [4, 5, 6].
INDICES = np.array([3, 1, 0, 2, 4, 5, 6])
BOUNDS = np.array([[0, 2, 3], [3, 4, 7]])
LOADS = np.array([[4.0, 1.0], [2.0, 6.0]])


def _plan(**extra):
    return EpochPlan(1, 2, INDICES, BOUNDS, LOADS, 0, 0, "digest", **extra)


def test_every_step_and_rank_has_its_view():
    plan = _plan()
    assert plan.num_steps == 2
    assert plan.counts.tolist() == [[2, 1], [1, 3]]
    assert plan.local(0, 0).tolist() == [3, 1] and plan.local(1, 1).tolist() == [4, 5, 6]
    assert plan.rank_indices(0).tolist() == [3, 1, 2]
    assert [s.tolist() for s in plan.rank_steps(1)] == [[0], [4, 5, 6]]


def test_loss_weights_scale_a_ranks_mean_to_its_share_of_the_step():
    weights = _plan().loss_weights
    assert weights.tolist() == [[2 * 2 / 3, 1 * 2 / 3], [1 * 2 / 4, 3 * 2 / 4]]
    # Averaging the ranks' weighted means gives the step's mean.
    assert weights.sum(axis=1).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("rank", [-1, 2])
def test_a_rank_outside_the_world_is_refused(rank):
    with pytest.raises(ValueError, match=rf"rank={rank} must be in \[0, 2\)"):
        _plan().rank_indices(rank)


def test_an_empty_plan_has_no_steps_and_empty_ranks():
    plan = EpochPlan(
        0, 3, np.empty(0, np.int64), np.empty((0, 4), np.int64), np.empty((0, 3)), 0, 0, "d"
    )
    assert plan.num_steps == 0 and plan.rank_indices(2).shape == (0,)
    stats = plan.stats(np.ones(0), np.ones(0))
    assert (stats.num_steps, stats.load_ratio_mean, stats.padding_fraction) == (0, 1.0, 0.0)


def test_a_window_counts_its_steps_from_the_epochs_start():
    window = WindowPlan(1, 5, 2, INDICES, BOUNDS, LOADS, "digest")
    assert window.num_steps == 2 and window.counts.tolist() == [[2, 1], [1, 3]]
    assert window.local(6, 1).tolist() == [4, 5, 6]
    np.testing.assert_array_equal(window.loss_weights, _plan().loss_weights)
    for step in (4, 7):
        with pytest.raises(ValueError, match=r"step .* is outside this window \(5\.\.6\)"):
            window.local(step, 0)


def test_micro_layout_numbers_micro_batches_and_sums_weights_per_rank():
    # Step 0: 1 micro-batch per rank; step 1: 2 per rank (W = 2).
    layout = MicroLayout(
        pieces=np.arange(7),
        starts=np.zeros(7, np.int64),
        lengths=np.ones(7, np.int64),
        rows=np.zeros(7, np.int64),
        num_micro=np.array([1, 2]),
        first=np.array([0, 2, 6]),
        bounds=np.array([0, 2, 3, 4, 4, 6, 7]),
        weights=np.array([1.5, 0.5, 0.5, 0.0, 1.0, 0.5]),
        capacity=4,
    )
    assert layout.index(0, 1) == 1
    assert layout.index(1, 0, 1) == 3 and layout.index(1, 1, 0) == 4
    assert layout.rank_weights(2).tolist() == [[1.5, 0.5], [0.5, 1.5]]
    plan = _plan(micro=layout)
    assert plan.loss_weights.tolist() == [[1.5, 0.5], [0.5, 1.5]]
    # Padding of a packed plan: the rows left empty, 6 micro-batches of 4 tokens, 7 used.
    assert plan.stats(np.ones(7), np.ones(7)).padding_fraction == pytest.approx(1 - 7 / 24)


def test_stats_measure_balance_bound_and_padding_by_hand():
    sizes = np.array([1.0, 1.0, 4.0, 3.0, 2.0, 2.0, 2.0])
    costs = sizes.copy()
    stats = PlanStats.of(_plan(), sizes, costs)
    # Step 0: loads (4, 1): max/mean 1.6; step 1: (2, 6): 1.5.
    assert stats.load_ratio_worst == pytest.approx(1.6)
    assert stats.load_ratio_mean == pytest.approx(1.55)
    # Bound: max(mean, largest sample of the step) / mean: step 0 3/2.5, step 1 4/4.
    assert stats.bound_worst == pytest.approx(1.2)
    assert stats.bound_mean == pytest.approx(1.1)
    # Padding to the longest of each local batch: (3,1)->6, (1)->1, (4)->4, (2,2,2)->6.
    assert stats.padding_fraction == pytest.approx(1 - 15 / 17)
    assert (stats.epoch, stats.num_steps, stats.num_padded, stats.num_dropped) == (1, 2, 0, 0)


def test_a_schedulers_plans_keep_the_documented_layout():
    sizes = np.random.default_rng(0).integers(1, 30, 200).astype(np.float64)
    plan = Scheduler(sizes, ScheduleConfig(4, 32)).plan_epoch(0)
    assert (plan.bounds[1:, 0] == plan.bounds[:-1, -1]).all()  # steps are contiguous
    assert sorted(plan.indices.tolist()) == list(range(200))
    packed = Scheduler(sizes, ScheduleConfig(4, 32, packing=Packing(max_tokens=64))).plan_epoch(0)
    micro = packed.micro
    assert micro is not None and micro.capacity == 64
    assert micro.first[-1] == micro.weights.shape[0] == micro.bounds.shape[0] - 1
    np.testing.assert_allclose(packed.loss_weights.sum(axis=1), 4.0)
