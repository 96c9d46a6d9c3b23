import hashlib
import io
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronica.core import ScheduleConfig, Scheduler
from chronica.runtime.progress import plan_epoch

MODES = [("static", True), ("static", False), ("guided", True)]


def _torch_counts(n, w, drop_last):
    """What torch's DistributedSampler does: per-rank length, padded and dropped counts."""
    if drop_last and n % w:
        per_rank = -(-(n - w) // w)
    else:
        per_rank = -(-n // w)
    total = per_rank * w
    return per_rank, max(0, total - n), max(0, n - total)


def _check_plan(sch, epoch):
    cfg = sch.config
    n, w = sch.num_samples, cfg.num_replicas
    plan = sch.plan_epoch(epoch)
    per_rank, padded, dropped = _torch_counts(n, w, cfg.drop_last)
    assert (plan.num_padded, plan.num_dropped) == (padded, dropped)
    assert plan.num_steps == sch.num_steps()
    streams = [plan.rank_indices(r) for r in range(w)]
    assert all(len(s) == per_rank for s in streams)
    # Equal counts on every rank at every step.
    counts = plan.counts
    assert np.all(counts == counts[:, :1])
    if cfg.batch_size is not None:
        assert np.all(counts.sum(axis=1)[:-1] == cfg.batch_size)
    # Exactly once, except torch's padding (repeats) or dropping.
    seen = Counter(np.concatenate(streams).tolist())
    if padded:
        assert set(seen) == set(range(n))
        assert sum(c - 1 for c in seen.values()) == padded
    else:
        assert all(c == 1 for c in seen.values())
        assert len(seen) == n - dropped
    # Loads are the costs of what each rank got.
    for s in range(plan.num_steps):
        for r in range(w):
            assert plan.loads[s, r] == pytest.approx(sch.costs[plan.local(s, r)].sum())
    return plan


@given(
    n=st.integers(0, 300),
    w=st.integers(1, 8),
    k=st.integers(1, 6),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    mode=st.sampled_from(MODES),
    epoch=st.integers(0, 3),
)
def test_exactly_once_equal_counts_every_mode(n, w, k, drop_last, shuffle, mode, epoch):
    sizes = np.random.default_rng(n).lognormal(3, 1, n)
    cfg = ScheduleConfig(
        w, w * k, kind=mode[0], exact=mode[1], shuffle=shuffle, drop_last=drop_last
    )
    _check_plan(Scheduler(sizes, cfg), epoch)


@given(n=st.integers(0, 50), w=st.integers(1, 7), drop_last=st.booleans())
def test_without_batch_size_the_split_is_torch_strided(n, w, drop_last):
    sch = Scheduler(np.ones(n), ScheduleConfig(w, None, shuffle=False, drop_last=drop_last))
    plan = _check_plan(sch, 0)
    per_rank, _, _ = _torch_counts(n, w, drop_last)
    padded = list(range(n)) * (per_rank * w // max(n, 1) + 1)
    for r in range(w):
        assert plan.rank_indices(r).tolist() == padded[: per_rank * w][r::w]


def test_uniform_sizes_reproduce_torch_strided_order_with_batches():
    sch = Scheduler(np.ones(103), ScheduleConfig(4, 16, shuffle=False))
    plan = sch.plan_epoch(0)
    padded = (list(range(103)) + [0])[:104]
    for r in range(4):
        assert plan.rank_indices(r).tolist() == padded[r::4]


def test_plans_are_deterministic_and_vary_by_epoch_and_seed():
    sizes = np.random.default_rng(0).lognormal(5, 1, 2000)
    for kind, exact in MODES:
        cfg = ScheduleConfig(8, 64, kind=kind, exact=exact)
        a, b = Scheduler(sizes, cfg), Scheduler(sizes, cfg)
        assert a.plan_epoch(1).indices.tobytes() == b.plan_epoch(1).indices.tobytes()
        assert a.plan_epoch(0).indices.tobytes() != a.plan_epoch(1).indices.tobytes()
        other = Scheduler(sizes, ScheduleConfig(8, 64, kind=kind, exact=exact, seed=1))
        assert other.plan_epoch(1).indices.tobytes() != a.plan_epoch(1).indices.tobytes()


def test_exact_mode_keeps_the_global_batches_of_plain_data_parallel():
    sizes = np.random.default_rng(1).lognormal(5, 1, 1000)
    plain = Scheduler(sizes, ScheduleConfig(4, None))
    balanced = Scheduler(sizes, ScheduleConfig(4, 32))
    order = plain.plan_epoch(2).indices  # the epoch permutation, padded
    plan = balanced.plan_epoch(2)
    for s in range(plan.num_steps):
        step = plan.indices[plan.bounds[s, 0] : plan.bounds[s, -1]]
        assert sorted(step.tolist()) == sorted(order[s * 32 : (s + 1) * 32].tolist())


def test_balancing_beats_strided_split():
    sizes = np.random.default_rng(2).lognormal(5, 1, 4096)
    strided = Scheduler(sizes, ScheduleConfig(8, 256, exact=True))
    stats = strided.stats(0)
    assert stats.load_ratio_mean < 1.001
    assert stats.load_ratio_mean <= stats.bound_mean * 1.001
    guided = Scheduler(sizes, ScheduleConfig(8, 256, kind="guided")).stats(0)
    assert guided.padding_fraction < stats.padding_fraction / 2


def test_pool_mode_puts_heavy_samples_together():
    rng = np.random.default_rng(3)
    sizes = rng.lognormal(5, 1, 4096)
    sizes[rng.choice(4096, 16, replace=False)] = np.median(sizes) * 100
    exact = Scheduler(sizes, ScheduleConfig(8, 256)).stats(0)
    pool = Scheduler(sizes, ScheduleConfig(8, 256, exact=False)).stats(0)
    assert pool.load_ratio_mean < exact.load_ratio_mean
    assert pool.load_ratio_worst < exact.load_ratio_worst


def test_same_plan_in_a_fresh_process():
    code = (
        "import numpy as np, hashlib;"
        "from chronica.core import Scheduler, ScheduleConfig;"
        "s = np.random.default_rng(5).lognormal(5, 1, 3000);"
        "p = Scheduler(s, ScheduleConfig(8, 128, kind='{kind}', exact={exact})).plan_epoch(3);"
        "print(hashlib.sha256(p.indices.tobytes() + p.bounds.tobytes()).hexdigest())"
    )
    sizes = np.random.default_rng(5).lognormal(5, 1, 3000)
    for kind, exact in MODES:
        plan = Scheduler(sizes, ScheduleConfig(8, 128, kind=kind, exact=exact)).plan_epoch(3)
        here = hashlib.sha256(plan.indices.tobytes() + plan.bounds.tobytes()).hexdigest()
        there = subprocess.run(
            [sys.executable, "-c", code.format(kind=kind, exact=exact)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert here == there


def test_bad_epoch():
    sch = Scheduler(np.ones(4), ScheduleConfig(2, 2))
    with pytest.raises(ValueError, match="epoch"):
        sch.plan_epoch(-1)


@pytest.mark.parametrize(
    "options", [{}, {"exact": False}, {"kind": "guided"}, {"shuffle": "local"}]
)
def test_planning_progress_counts_every_step_and_changes_nothing(options):
    sizes = np.random.default_rng(3).lognormal(4, 1, 20_000)
    groups = {"groups": [0, 0, 1, 1]} if options.get("shuffle") == "local" else {}
    config = ScheduleConfig(num_replicas=4, batch_size=64, **options, **groups)
    seen: list[tuple[int, int]] = []
    plan = Scheduler(sizes, config).plan_epoch(1, progress=lambda d, t: seen.append((d, t)))
    expect = Scheduler(sizes, config).plan_epoch(1)
    np.testing.assert_array_equal(plan.indices, expect.indices)
    np.testing.assert_array_equal(plan.bounds, expect.bounds)
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1][0] == seen[-1][1] == {t for _, t in seen}.pop()


def test_planning_progress_bar_shows_on_the_given_stream():
    sizes = np.random.default_rng(3).lognormal(4, 1, 20_000)
    scheduler = Scheduler(sizes, ScheduleConfig(num_replicas=4, batch_size=64))
    out = io.StringIO()
    plan = plan_epoch(scheduler, 0, min_samples=0, delay=0, file=out, disable=False)
    assert plan.num_steps == scheduler.num_steps()
    assert "chronica: planning epoch 0" in out.getvalue()
    quiet = io.StringIO()  # a small data set plans without a bar
    assert plan_epoch(scheduler, 1, delay=0, file=quiet, disable=False).num_steps
    assert quiet.getvalue() == ""


def test_linear_costs_share_the_sizes_unless_a_size_is_negative_zero():
    sizes = np.array([3.0, 0.0, 5.0])
    config = ScheduleConfig(num_replicas=1, batch_size=1)
    assert Scheduler(sizes, config).costs is Scheduler(sizes, config).sizes
    signed = Scheduler(np.array([3.0, -0.0, 5.0]), config)
    assert signed.costs is not signed.sizes and not np.signbit(signed.costs).any()
    assert not Scheduler(sizes, ScheduleConfig(1, 1, cost="quadratic")).costs.flags.writeable
