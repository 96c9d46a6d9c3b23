"""chronica.core.packing.outliers: outlier delay across steps.

Every document exactly once per epoch, delays within ``max_delay``, the queue within
``max_queue`` and empty at the epoch's end, for the pure rule (``delay_outliers``), for
packed plans (both balance objectives, shuffle policies, a token budget, ``drop_last``,
``kind="dynamic"``'s windows), across a mid-epoch resume with documents still held (bitwise)
and an elastic change of world (exactly once), and for ``OutlierQueue`` with its state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronica import OutlierDelay, OutlierQueue
from chronica.core import Packing, ScheduleConfig, Scheduler
from chronica.core.dynamic import DynamicPlanner
from chronica.core.elastic import Segment, resume_plan
from chronica.core.packing.outliers import delay_outliers
from chronica.runtime.stream import RankStream

CAP = 64
ATTENTION = (0.0, 8.0, 1.0)


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    """Long-tailed lengths in ``[1, CAP]``: a few documents near the cap, most short."""
    return np.clip(np.random.default_rng(seed).lognormal(2.0, 1.0, n).astype(int), 1, CAP)


def _scheduler(n=240, world=4, batch=16, seed=0, delay=None, **options):
    delay = OutlierDelay(max_delay=3) if delay is None else delay
    packing_options = {k: options.pop(k) for k in ("balance", "tokens_per_step") if k in options}
    packing = Packing(max_tokens=CAP, outliers=delay, **packing_options)
    config = ScheduleConfig(world, batch, packing=packing, cost=ATTENTION, **options)
    return Scheduler(_lengths(n, seed), config)


def _doc_steps(plan) -> np.ndarray:
    """The step every document is trained at (-1: not in the plan)."""
    steps = np.full(plan.indices.max(initial=-1) + 1, -1)
    for s in range(plan.num_steps):
        steps[plan.indices[plan.bounds[s, 0] : plan.bounds[s, -1]]] = s
    return steps


def _held_after(plan, step: int) -> int:
    """Documents whose step in the epoch's order is before ``step`` but trained at or after
    it: the queue's size when ``step`` steps are done."""
    delays = np.zeros(plan.indices.max() + 1, np.int64)
    delays[plan.indices] = plan.micro.delays
    trained_at = _doc_steps(plan)
    return int(np.sum((trained_at >= step) & (trained_at - delays[: trained_at.shape[0]] < step)))


# -- the option -------------------------------------------------------------------------------


def test_the_option_validates_its_fields_by_name():
    with pytest.raises(ValueError, match="threshold"):
        OutlierDelay(threshold=0)
    with pytest.raises(TypeError, match="max_delay"):
        OutlierDelay(max_delay=1.5)
    with pytest.raises(ValueError, match="max_delay"):
        OutlierDelay(max_delay=0)
    with pytest.raises(ValueError, match="max_queue"):
        OutlierDelay(max_queue=0)
    with pytest.raises(TypeError, match="outliers"):
        Packing(max_tokens=CAP, outliers=3)
    assert OutlierDelay().queue_bound(8) == 32 and OutlierDelay(max_queue=5).queue_bound(8) == 5


def test_the_option_is_one_packing_field_in_its_repr_and_the_digest():
    plain = Packing(max_tokens=CAP)
    delayed = Packing(max_tokens=CAP, outliers=OutlierDelay(max_delay=2))
    assert repr(delayed) == (
        "Packing(max_tokens=64, outliers=OutlierDelay(threshold=0.5, max_delay=2, max_queue=None))"
    )
    assert len(delayed.to_tuple()) == len(plain.to_tuple()) + 1  # unset: digests unchanged
    digests = {ScheduleConfig(2, 8, packing=p).digest("s") for p in (plain, delayed)}
    assert len(digests) == 2


def test_without_the_option_plans_carry_no_delays():
    sizes = _lengths(120)
    plan = Scheduler(sizes, ScheduleConfig(4, 16, packing=Packing(max_tokens=CAP))).plan_epoch(0)
    assert plan.micro.delays is None
    scheduler = Scheduler(sizes, ScheduleConfig(4, 16, packing=Packing(max_tokens=CAP)))
    stats = scheduler.plan_stats(plan)
    assert stats.delay_counts == () and stats.delay_quantiles == {}


# -- the rule ---------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    docs=st.integers(0, 120),
    ranks=st.integers(1, 6),
    threshold=st.sampled_from([0.2, 0.5, 1.0, 2.0]),
    max_delay=st.integers(1, 5),
    max_queue=st.sampled_from([None, 1, 3, 10]),
    seed=st.integers(0, 2**16),
)
def test_property_every_document_once_within_its_delay_and_the_queue_bound(
    sizes, docs, ranks, threshold, max_delay, max_queue, seed
):
    rng = np.random.default_rng(seed)
    costs = rng.pareto(1.2, docs) + 0.01
    weights = costs * rng.uniform(0.5, 1.0, docs)  # a heaviest piece is part of the cost
    cuts = np.minimum(np.cumsum([0, *sizes]) * max(1, docs // sum(sizes)), docs)
    cuts[-1] = docs
    steps = [np.arange(cuts[s], cuts[s + 1]) for s in range(len(sizes))]
    delay = OutlierDelay(threshold, max_delay, max_queue)
    out, delays = delay_outliers(steps, costs, weights, ranks, delay)
    again, _ = delay_outliers(steps, costs, weights, ranks, delay)
    assert [a.tobytes() for a in out] == [a.tobytes() for a in again]  # pure
    trained = np.concatenate(out)
    np.testing.assert_array_equal(np.sort(trained), np.arange(docs))  # once each, drained
    origin = np.concatenate([np.full(s.shape[0], i) for i, s in enumerate(steps)])
    for s, (docs_s, delays_s) in enumerate(zip(out, delays, strict=True)):
        np.testing.assert_array_equal(s - origin[docs_s], delays_s)  # reported delays
        assert delays_s.min(initial=0) >= 0 and delays_s.max(initial=0) <= max_delay
        done = np.concatenate(out[: s + 1])
        held = int(np.sum(origin <= s)) - done.shape[0]  # of the steps so far, not trained
        assert 0 <= held <= delay.queue_bound(ranks)


def test_a_heavy_document_waits_for_company_and_goes_with_it():
    # Two ranks: a 9 beside three 1s is a wall; two 9s fill both ranks.
    costs = np.array([1.0, 1.0, 9.0, 1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    steps = [np.arange(0, 4), np.arange(4, 8), np.arange(8, 12)]
    out, delays = delay_outliers(steps, costs, costs, 2, OutlierDelay(max_delay=4))
    assert [s.tolist() for s in out] == [[0, 1, 3], [4, 6, 7], [8, 9, 10, 11, 2, 5]]
    assert [d.tolist() for d in delays] == [[0, 0, 0], [0, 0, 0], [0, 0, 0, 0, 2, 1]]
    # With one step of delay at most, no document waits longer.
    out, delays = delay_outliers(steps, costs, costs, 2, OutlierDelay(max_delay=1))
    assert sorted(np.concatenate(out).tolist()) == list(range(12))
    assert max(d.max() for d in delays) == 1


# -- packed plans -----------------------------------------------------------------------------


@pytest.mark.parametrize("balance", ["rank", "micro"])
@pytest.mark.parametrize("shuffle", [True, False, "block", "local"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_packed_epoch_trains_every_document_once_within_the_bounds(balance, shuffle, drop_last):
    groups = (0, 0, 1, 1) if shuffle == "local" else None
    delay = OutlierDelay(max_delay=3, max_queue=6)
    scheduler = _scheduler(
        243,
        4,
        20,
        delay=delay,
        balance=balance,
        shuffle=shuffle,
        drop_last=drop_last,
        groups=groups,
    )
    plan = scheduler.plan_epoch(1)
    # The documents the undelayed plan trains (node partitions may pad or cut), once each.
    packing = Packing(max_tokens=CAP, balance=balance)
    undelayed = Scheduler(
        scheduler.sizes, ScheduleConfig(**{**vars(scheduler.config), "packing": packing})
    ).plan_epoch(1)
    np.testing.assert_array_equal(np.sort(plan.indices), np.sort(undelayed.indices))
    if shuffle != "local":
        assert plan.indices.shape[0] == len(set(plan.indices.tolist()))
        assert plan.indices.shape[0] + plan.num_dropped == 243
    micro = plan.micro
    assert micro.delays.shape == plan.indices.shape
    assert micro.delays.min() >= 0 and micro.delays.max() <= 3
    assert micro.delays.max() > 0  # the data has outliers to delay
    tokens = np.add.reduceat(micro.lengths, micro.bounds[:-1][np.diff(micro.bounds) > 0])
    assert tokens.max() <= CAP  # the cap holds
    for s in range(plan.num_steps):  # every rank the same micro-batch count
        assert micro.first[s + 1] - micro.first[s] == 4 * micro.num_micro[s]
    ranks_per_owner = 2 if shuffle == "local" else 4
    for s in range(plan.num_steps):
        assert _held_after(plan, s) <= delay.queue_bound(ranks_per_owner) * (4 // ranks_per_owner)
    assert _held_after(plan, plan.num_steps) == 0  # drained
    stats = scheduler.plan_stats(plan)
    assert sum(stats.delay_counts) == plan.indices.shape[0]
    assert stats.delay_quantiles["max"] == micro.delays.max()


def test_delay_balances_steps_better_where_one_document_is_a_wall():
    sizes = _lengths(640, seed=3)
    plain = Scheduler(sizes, ScheduleConfig(8, 32, packing=Packing(CAP), cost=ATTENTION))
    delayed = _scheduler(640, 8, 32, seed=3, delay=OutlierDelay())
    ratio = [
        (p.loads.max(1).sum() / p.loads.mean(1).sum())
        for p in (plain.plan_epoch(0), delayed.plan_epoch(0))
    ]
    assert ratio[1] < ratio[0]


def test_a_token_budget_keeps_every_document_once():
    scheduler = _scheduler(200, 3, None, tokens_per_step=300)
    plan = scheduler.plan_epoch(0)
    np.testing.assert_array_equal(np.sort(plan.indices), np.arange(200))


def test_dynamic_windows_repack_the_delayed_steps():
    scheduler = _scheduler(200, 4, 16, kind="dynamic", window=3)
    static = scheduler.plan_epoch(0)
    planner = DynamicPlanner(scheduler)
    for first in range(0, static.num_steps, 3):
        window = planner.plan_window(0, first)
        for i in range(window.num_steps):
            s = first + i
            ours = window.indices[window.bounds[i, 0] : window.bounds[i, -1]]
            theirs = static.indices[static.bounds[s, 0] : static.bounds[s, -1]]
            assert sorted(ours.tolist()) == sorted(theirs.tolist())


# -- resume -----------------------------------------------------------------------------------


def _a_step_with_documents_held(plan) -> int:
    held = [s for s in range(1, plan.num_steps) if _held_after(plan, s)]
    assert held, "the case must hold documents across a step"
    return held[len(held) // 2]


def test_a_mid_epoch_resume_with_documents_held_is_bitwise():
    world = 4
    scheduler = _scheduler(300, world, 16)
    step = _a_step_with_documents_held(scheduler.plan_epoch(0))
    for rank in range(world):
        whole = RankStream(_scheduler(300, world, 16), rank)
        batches = list(whole.batches())
        first = RankStream(_scheduler(300, world, 16), rank)
        it = first.batches()
        for _ in range(step):
            next(it)
        state = json.loads(json.dumps(first.state()))
        again = RankStream(_scheduler(300, world, 16), rank)
        again.load_state(state)
        rest = list(again.batches())
        assert len(rest) == len(batches) - step
        for ours, theirs in zip(rest, batches[step:], strict=True):
            assert ours.indices.tobytes() == theirs.indices.tobytes()
            assert [m.indices.tobytes() + m.starts.tobytes() for m in ours.micro] == [
                m.indices.tobytes() + m.starts.tobytes() for m in theirs.micro
            ]


@pytest.mark.parametrize(("w2", "b2"), [(2, 8), (6, 24), (3, 15)])
def test_an_elastic_resume_with_documents_held_trains_each_once(w2, b2):
    old = _scheduler(300, 4, 16)
    plan = old.plan_epoch(0)
    step = _a_step_with_documents_held(plan)
    trained = plan.indices[: plan.bounds[step, 0]]
    new = _scheduler(300, w2, b2)
    rest = resume_plan(new, 0, [Segment(4, 16, step)])
    assert rest is not None and rest.micro.delays is not None
    assert not set(trained.tolist()) & set(rest.indices.tolist())
    assert sorted([*trained.tolist(), *rest.indices.tolist()]) == list(range(300))
    # And once more at a third world, from the middle of the remainder.
    later = _a_step_with_documents_held(rest) if rest.num_steps > 2 else 1
    third = _scheduler(300, 3, 12)
    segments = [Segment(4, 16, step), Segment(w2, b2, later)]
    final = resume_plan(third, 0, segments)
    done = [*trained.tolist(), *rest.indices[: rest.bounds[later, 0]].tolist()]
    assert sorted([*done, *final.indices.tolist()]) == list(range(300))


# -- OutlierQueue -------------------------------------------------------------------------------


def _queue_run(queue, batches, start=0):
    out = []
    for s in range(start, len(batches)):
        ids, lengths = batches[s]
        out.append(queue.step(ids, lengths, last=s == len(batches) - 1))
    return out


def _batches(steps=12, per_step=10, seed=0):
    lengths = _lengths(steps * per_step, seed)
    ids = np.arange(steps * per_step) + 1000
    return [
        (ids[s * per_step : (s + 1) * per_step], lengths[s * per_step : (s + 1) * per_step])
        for s in range(steps)
    ]


def test_the_queue_releases_every_document_once_within_its_bounds():
    batches = _batches()
    queue = OutlierQueue(2, OutlierDelay(max_delay=2, max_queue=3), cost=ATTENTION)
    released = _queue_run(queue, batches)
    ids = np.concatenate([r.ids for r in released])
    assert sorted(ids.tolist()) == list(range(1000, 1120)) and queue.num_held == 0
    lengths = dict(
        zip(
            np.concatenate([b[0] for b in batches]).tolist(),
            np.concatenate([b[1] for b in batches]).tolist(),
            strict=True,
        )
    )
    for r in released:
        assert [lengths[i] for i in r.ids.tolist()] == r.lengths.tolist()
        assert r.delays.max(initial=0) <= 2
    assert any(r.delays.max(initial=0) > 0 for r in released)


def test_the_queue_state_round_trips_mid_epoch_with_documents_held():
    batches = _batches(seed=4)
    delay = OutlierDelay(max_delay=3)
    whole = _queue_run(OutlierQueue(2, delay, cost=ATTENTION), batches)
    queue = OutlierQueue(2, delay, cost=ATTENTION)
    for s in range(12):
        queue.step(*batches[s])
        if queue.num_held:
            break
    state = json.loads(json.dumps(queue.state_dict()))
    assert state["ids"] and state["step"] == s + 1
    again = OutlierQueue(2, delay, cost=ATTENTION)
    again.load_state_dict(state)
    rest = _queue_run(again, batches, start=s + 1)
    for ours, theirs in zip(rest, whole[s + 1 :], strict=True):
        assert ours.ids.tobytes() == theirs.ids.tobytes()
        assert ours.delays.tobytes() == theirs.delays.tobytes()


def test_the_queue_refuses_bad_arguments_and_states():
    with pytest.raises(TypeError, match="delay"):
        OutlierQueue(2, delay=3)
    with pytest.raises(ValueError, match="num_replicas"):
        OutlierQueue(0)
    queue = OutlierQueue(2)
    with pytest.raises(ValueError, match="lengths"):
        queue.step([1, 2], [3])
    with pytest.raises(ValueError, match="version"):
        queue.load_state_dict({"version": 9})
    with pytest.raises(ValueError, match="since"):
        queue.load_state_dict({"version": 1, "step": 1, "ids": [1], "lengths": [2], "since": [5]})
    assert "OutlierQueue(num_replicas=2" in repr(queue)
