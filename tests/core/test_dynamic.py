"""chronica.core.dynamic: DynamicPlanner driven with given reports (no coordinator, no
sockets). Every window keeps each step's samples exactly once, counts stay within the
batch bounds, equal reports give equal bytes, and a slower rank gets less work."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.core.dynamic import DynamicPlanner
from chronica.sim.speeds import SpeedProfile

WORLD, BATCH, WINDOW = 4, 32, 4
SLOW = 3  # rank 3 takes 4x as long per unit of load
FACTORS = np.array([1.0, 1.0, 1.0, 4.0])


def _sizes(n=1000, seed=1):
    return np.random.default_rng(seed).lognormal(4, 1, n)


def _planner(n=1000, **options):
    options = {"batch_size": BATCH, "window": WINDOW, **options}
    config = ScheduleConfig(num_replicas=WORLD, kind="dynamic", **options)
    return DynamicPlanner(Scheduler(_sizes(n), config))


def _drive(planner, epoch=0, windows=None):
    """Plan every window of ``epoch`` in turn, reporting after each step what the ranks
    would measure (``0.01 + load * 1e-4 * FACTORS``); returns the windows."""
    out = []
    count = planner.num_windows(epoch) if windows is None else windows
    for w in range(count):
        plan = planner.plan_window(epoch, w * planner.window)
        for i, step in enumerate(range(plan.first_step, plan.first_step + plan.num_steps)):
            for r in range(WORLD):
                load = float(plan.loads[i, r])
                planner.observe(r, step, load, 0.01 + load * 1e-4 * FACTORS[r])
        out.append(plan)
    return out


@pytest.mark.parametrize("variable_batch", [False, True])
def test_every_window_holds_each_steps_samples_exactly_once(variable_batch):
    planner = _planner(variable_batch=variable_batch)
    static = planner.scheduler.plan_epoch(0)
    windows = _drive(planner)
    assert sum(w.num_steps for w in windows) == static.num_steps
    for plan in windows:
        for i, step in enumerate(range(plan.first_step, plan.first_step + plan.num_steps)):
            ours = np.concatenate([plan.local(step, r) for r in range(WORLD)])
            theirs = static.indices[static.bounds[step, 0] : static.bounds[step, -1]]
            assert Counter(ours.tolist()) == Counter(theirs.tolist())
            assert plan.counts[i].sum() == theirs.shape[0]
            if not variable_batch:
                assert len(set(plan.counts[i].tolist())) == 1  # equal counts
            np.testing.assert_allclose(plan.loss_weights[i].sum(), WORLD)


@pytest.mark.parametrize(("low", "high"), [(None, None), (6, 10), (8, 8)])
def test_variable_batches_stay_within_their_bounds(low, high):
    planner = _planner(variable_batch=True, min_batch=low, max_batch=high)
    low, high = planner.config.batch_bounds()
    static = planner.scheduler.plan_epoch(0)
    for plan in _drive(planner):
        steps = range(plan.first_step, plan.first_step + plan.num_steps)
        full = np.array([static.counts[s].sum() == BATCH for s in steps])
        assert (plan.counts[full] >= low).all() and (plan.counts[full] <= high).all()
        assert (plan.counts.sum(axis=1) == static.counts[list(steps)].sum(axis=1)).all()


def test_a_slower_rank_gets_fewer_samples_with_variable_batches():
    planner = _planner(variable_batch=True)
    late = _drive(planner)[-3:]
    counts = np.concatenate([p.counts for p in late])
    assert (counts[:, SLOW] < counts[:, 0]).all()
    assert counts[:, SLOW].mean() < 0.5 * counts[:, :SLOW].mean()  # about a quarter


def test_with_equal_counts_a_slower_rank_gets_lighter_samples():
    planner = _planner()
    late = _drive(planner)[-3:]
    loads = np.concatenate([p.loads for p in late])
    counts = np.concatenate([p.counts for p in late])
    assert (counts == counts[:, :1]).all()  # equal counts (the last step is shorter)
    assert loads[:, SLOW].sum() < 0.75 * loads[:, :SLOW].sum(axis=0).min()


def test_equal_reports_give_byte_identical_windows_and_a_window_is_planned_once():
    a, b = _drive(_planner(variable_batch=True)), _drive(_planner(variable_batch=True))
    for x, y in zip(a, b, strict=True):
        assert x.indices.tobytes() == y.indices.tobytes()
        assert x.bounds.tobytes() == y.bounds.tobytes()
        assert x.loads.tobytes() == y.loads.tobytes()
    planner = _planner()
    first = planner.plan_window(0, 0)
    planner.observe(SLOW, 0, 1.0, 100.0)  # later reports change later windows only
    assert planner.plan_window(0, 0) is first and planner.planned(0, 0) is first
    assert planner.planned(0, WINDOW) is None
    assert not first.indices.flags.writeable


def test_windows_of_epochs_two_back_are_forgotten():
    planner = _planner(n=200)
    planner.plan_window(0, 0)
    planner.plan_window(1, 0)
    assert planner.forgotten == 0 and planner.planned(0, 0) is not None
    planner.plan_window(2, 0)
    assert planner.forgotten == 1 and planner.planned(0, 0) is None
    assert planner.planned(1, 0) is not None


def test_the_window_count_and_bad_first_steps():
    planner = _planner(n=1000)  # 1000 / 32 -> 32 steps: 8 windows of 4
    steps = planner.scheduler.num_steps(0)
    assert planner.num_windows(0) == -(-steps // WINDOW)
    for first in (1, steps + WINDOW - steps % WINDOW, -WINDOW):
        with pytest.raises(ValueError, match=rf"first_step={first} must be a multiple of window"):
            planner.plan_window(0, first)


def test_a_planner_needs_kind_dynamic():
    scheduler = Scheduler(_sizes(100), ScheduleConfig(num_replicas=WORLD, batch_size=BATCH))
    with pytest.raises(ValueError, match="DynamicPlanner needs kind='dynamic'"):
        DynamicPlanner(scheduler)


def test_packed_windows_repack_every_steps_pieces_and_give_a_slow_rank_fewer_tokens():
    sizes = np.clip(_sizes(600, seed=2).astype(int), 1, 256)
    packing = Packing(256, row_length=128, tokens_per_step=6000, long_documents="split")
    config = ScheduleConfig(WORLD, None, kind="dynamic", window=WINDOW, packing=packing)
    scheduler = Scheduler(sizes, config)
    planner = DynamicPlanner(scheduler)
    static = scheduler.plan_epoch(0)
    table = scheduler.pieces
    shares = []
    for w in range(planner.num_windows(0)):
        plan = planner.plan_window(0, w * WINDOW)
        layout = plan.micro
        for i, step in enumerate(range(plan.first_step, plan.first_step + plan.num_steps)):
            whole = static.micro.pieces[static.bounds[step, 0] : static.bounds[step, -1]]
            ours = layout.pieces[plan.bounds[i, 0] : plan.bounds[i, -1]]
            assert Counter(ours.tolist()) == Counter(whole.tolist())  # every piece once
            tokens = []
            for r in range(WORLD):
                span = layout.pieces[plan.bounds[i, r] : plan.bounds[i, r + 1]]
                lengths = table.length[span].astype(float)
                tokens.append(lengths.sum())
                work = np.array([lengths.shape[0], lengths.sum(), (lengths**2).sum()])
                seconds = (1e-5 * lengths.sum() + 1e-8 * (lengths**2).sum()) * FACTORS[r]
                planner.observe(r, step, 0.0, seconds, work)
            shares.append(tokens)
    late = np.array(shares[-4:])
    assert (late[:, SLOW] < 0.5 * late[:, 0]).all()


@pytest.mark.parametrize("variable", [False, True])
@pytest.mark.parametrize("groups", [None, [0, 0, 1, 1]])
def test_planner_keeps_every_step_and_equalises_times(variable, groups):
    sizes = np.random.default_rng(1).lognormal(5, 1, 3001)
    config = ScheduleConfig(
        num_replicas=4,
        batch_size=64,
        kind="dynamic",
        variable_batch=variable,
        window=5,
        groups=groups,
        shuffle="local" if groups else True,
    )
    scheduler = Scheduler(sizes, config)
    planner = DynamicPlanner(scheduler)
    speeds = SpeedProfile.omnilearn("HL8").speeds(0)
    static = scheduler.plan_epoch(0)
    ratios = []
    for first in range(0, scheduler.num_steps(), 5):
        plan = planner.plan_window(0, first)
        assert planner.plan_window(0, first) is plan  # never planned twice
        for i, step in enumerate(range(first, first + plan.num_steps)):
            a, b = static.bounds[step, 0], static.bounds[step, -1]
            got = np.sort(np.concatenate([plan.local(step, r) for r in range(4)]))
            np.testing.assert_array_equal(got, np.sort(static.indices[a:b]))
            for ranks in scheduler.owners.ranks:  # samples stay on their node
                mine = np.concatenate([plan.local(step, int(r)) for r in ranks])
                theirs = np.concatenate([static.local(step, int(r)) for r in ranks])
                np.testing.assert_array_equal(np.sort(mine), np.sort(theirs))
            if not variable:
                assert len(set(plan.counts[i].tolist())) == 1
            times = 0.01 + plan.loads[i] / speeds * 1e-4
            for r in range(4):
                planner.observe(r, step, plan.loads[i, r], times[r])
            ratios.append(times.max() / times.min())
    late = np.median(ratios[len(ratios) // 2 :])
    # Equal counts cannot absorb an 8x speed gap; speed-proportional counts can.
    assert late < (1.05 if variable and groups is None else 3.0)


def test_planner_without_feedback_equals_the_static_split():
    sizes = np.random.default_rng(2).lognormal(5, 1, 640)
    config = ScheduleConfig(num_replicas=4, batch_size=64, kind="dynamic", window=3)
    scheduler = Scheduler(sizes, config)
    planner = DynamicPlanner(scheduler)
    static = scheduler.plan_epoch(0)
    plan = planner.plan_window(0, 0)
    for step in range(3):
        for r in range(4):
            np.testing.assert_array_equal(plan.local(step, r), static.local(step, r))
    with pytest.raises(ValueError, match="multiple of window"):
        planner.plan_window(0, 1)
