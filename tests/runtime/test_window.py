"""A window's check, without sockets: each rank's own checks (``window.fault``) and the
ranks' imbalances (``window.imbalance``), which sum to 0 modulo the prime exactly when the
parts together are the static window, for the coordinator's own messages and tampered ones."""

from __future__ import annotations

from dataclasses import replace as _with

import numpy as np
import pytest

from chronica.comm.coordinator import Coordinator
from chronica.comm.protocol import decode
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.multiset import KEY_WORDS, MODULUS
from chronica.runtime import window

WORLD, FIRST, STEPS = 4, 4, 4


@pytest.fixture(scope="module")
def job():
    """The static plan, and every rank's plan of window ``FIRST`` as the coordinator
    encodes it."""
    sizes = np.random.default_rng(3).lognormal(5, 1, 800)
    config = ScheduleConfig(WORLD, 64, kind="dynamic", variable_batch=True, window=STEPS)
    scheduler = Scheduler(sizes, config)
    coordinator = Coordinator(scheduler, "127.0.0.1", 0)  # never started: no socket
    for rank in range(WORLD):  # rank 3 is slow: the window differs from the static plan
        coordinator.planner.observe(rank, 0, 1.0, 3.0 if rank == 3 else 1.0)
    planned = coordinator.planner.plan_window(0, FIRST)
    plans = [decode(coordinator._part(planned, r, 0), 1 << 20)["plan"] for r in range(WORLD)]
    return scheduler, scheduler.plan_epoch(0), plans


def _sum(plans, static, seed=0):
    key = np.random.default_rng(seed).integers(-(1 << 63), 1 << 63, KEY_WORDS, dtype=np.int64)
    words = [window.imbalance(p, static, r, FIRST, FIRST + STEPS, key) for r, p in enumerate(plans)]
    return np.sum(words, axis=0) % MODULUS


def _faults(scheduler, static, plans):
    n = scheduler.sizes.shape[0]
    return [
        window.fault(p, static, scheduler.config, r, FIRST, FIRST + STEPS, n)
        for r, p in enumerate(plans)
    ]


def test_the_coordinators_window_passes_and_sums_to_zero(job):
    scheduler, static, plans = job
    assert not all(
        np.array_equal(p.indices, np.concatenate([static.local(s, r) for s in range(4, 8)]))
        for r, p in enumerate(plans)
    )  # a real re-split, not the static plan
    assert _faults(scheduler, static, plans) == [None] * WORLD
    for seed in range(3):
        assert not _sum(plans, static, seed).any()
    assert len({window.token(p) for p in plans}) == 1


def test_swapped_parts_are_still_the_window(job):
    scheduler, static, plans = job
    swapped = [plans[1], plans[0], *plans[2:]]
    assert _faults(scheduler, static, swapped) == [None] * WORLD
    assert not _sum(swapped, static).any()


def test_parts_that_are_not_the_window_never_sum_to_zero(job):
    """A repeat (and so a missing part), a sample moved to another step, a sample left out:
    every rank's own checks pass, and every word of the sum is off."""
    scheduler, static, plans = job
    repeat = [plans[0], plans[0], *plans[2:]]
    moved = plans[0].indices.copy()
    a, b = plans[0].offsets[0], plans[0].offsets[1]
    moved[a], moved[b] = moved[b], moved[a]  # two steps trade a sample each
    shorter = plans[0].offsets.copy()
    shorter[1:] -= 1  # the first step loses its last sample
    weights = plans[0].weights.copy()
    weights[0] = np.diff(shorter)[0] * WORLD / (static.bounds[FIRST, -1] - static.bounds[FIRST, 0])
    variants = [
        repeat,
        [_with(plans[0], indices=moved), *plans[1:]],
        [
            _with(
                plans[0],
                indices=np.delete(plans[0].indices, b - 1),
                offsets=shorter,
                weights=weights,
            ),
            *plans[1:],
        ],
    ]
    for tampered in variants:
        assert _faults(scheduler, static, tampered) == [None] * WORLD
        assert _sum(tampered, static).all()


def test_what_a_rank_refuses_alone(job):
    scheduler, static, plans = job
    n = scheduler.sizes.shape[0]
    own = plans[1]
    cases = {
        "it covers epoch 0 steps 8+4": _with(own, first=8),
        "it names item": _with(own, indices=own.indices + n),
        "has loss weight": _with(own, weights=own.weights * 2),
        "gives rank 1 0 samples": _with(
            own,
            indices=own.indices[own.offsets[1] :],
            offsets=np.maximum(own.offsets - own.offsets[1], 0),  # its first step empty
        ),
    }
    for why, plan in cases.items():
        got = window.fault(plan, static, scheduler.config, 1, FIRST, FIRST + STEPS, n)
        assert got is not None and why in got, (why, got)


def test_a_token_names_one_planning_of_one_window(job):
    _, _, plans = job
    token = window.token(plans[0])
    assert len(token) == 4 and token != (0, 0, 0, 0)
    assert all(0 <= word < 1 << 62 for word in token)
    assert window.token(_with(plans[0], gen=plans[0].gen + 1)) != token
    assert window.token(_with(plans[0], first=FIRST + STEPS)) != token


def test_without_a_plan_a_rank_adds_nothing_to_the_vote(job):
    _, static, _ = job
    key = np.arange(KEY_WORDS, dtype=np.int64)
    assert not window.imbalance(None, static, 0, FIRST, FIRST + STEPS, key).any()


def test_counts_other_than_the_static_ones_need_variable_batches(job):
    scheduler, static, plans = job
    fixed = _with(scheduler.config, variable_batch=False)
    n = scheduler.sizes.shape[0]
    faults = [
        window.fault(p, static, fixed, r, FIRST, FIRST + STEPS, n) for r, p in enumerate(plans)
    ]
    assert any(
        f is not None and "(a count the ranks' loops could not all run)" in f for f in faults
    )
