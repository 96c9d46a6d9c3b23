"""chronica.runtime.session: DynamicSession against real coordinators on 127.0.0.1 (ranks
are threads of this process; ports are picked by the OS where no other rank must know
them). Every step holds the static plan's samples whichever source serves its window,
ranks never mix two plannings of a window, and the session checks its arguments and
transport settings (ports, CHRONICA_COORDINATOR) before it starts anything."""

from __future__ import annotations

import math
import threading
from collections import Counter

import numpy as np
import pytest
from kv_store import LocalStore
from thread_total import ThreadTotal
from workers import free_ports, scaled

from chronica.comm.coordinator import Coordinator
from chronica.core import ScheduleConfig, Scheduler
from chronica.runtime.agreement import KeyValueAgreement
from chronica.runtime.session import DynamicSession

WINDOW = 4


def _scheduler(world, n=300, **options):
    sizes = np.random.default_rng(7).lognormal(3, 1, n)
    config = ScheduleConfig(
        num_replicas=world, batch_size=8 * world, kind="dynamic", window=WINDOW, **options
    )
    return Scheduler(sizes, config)


def _step_samples(plan, step):
    return Counter(plan.indices[plan.bounds[step, 0] : plan.bounds[step, -1]].tolist())


def test_one_rank_takes_every_window_from_its_own_coordinator():
    scheduler = _scheduler(1)
    session = DynamicSession(scheduler, 0, host="127.0.0.1", port=0, timeout=scaled(10))
    try:
        assert session.coordinator is not None and session.coordinator.endpoint[1] > 0
        static = scheduler.plan_epoch(0)
        got = []
        for step, indices, weight, micro in session.steps(0):
            got.append(step)
            assert Counter(indices.tolist()) == _step_samples(static, step)
            assert weight == pytest.approx(1.0) and micro == ()
            session.report(1e-3)
        assert got == list(range(static.num_steps))
        windows = -(-static.num_steps // WINDOW)
        assert (session.windows_dynamic, session.windows_static) == (windows, 0)
        assert session.plans_refused == 0
        resumed = [step for step, *_ in session.steps(1, start=6)]  # mid-epoch, mid-window
        assert resumed == list(range(6, scheduler.num_steps(1)))
        session.report(1e-3, step=10**6)  # a step it never yielded: ignored
    finally:
        session.close()
    assert session.coordinator is None
    session.close()  # idempotent


def test_two_ranks_split_every_step_once_and_a_slow_rank_gets_fewer_samples():
    world = 2
    scheduler = _scheduler(world, n=600, variable_batch=True)
    static = scheduler.plan_epoch(0)
    store = LocalStore()
    port = free_ports(2)[0]
    sessions: list[DynamicSession | None] = [None, None]
    got: list[list] = [[], []]
    errors: list[BaseException] = []
    listening = threading.Event()

    def rank(r):
        try:
            if r == 1 and not listening.wait(scaled(60)):
                raise TimeoutError("rank 0's coordinator never listened")
            agree = KeyValueAgreement(
                store.put, store.get, r, world, prefix="s", timeout_ms=60_000, delete=store.delete
            )
            session = DynamicSession(
                scheduler, r, host="127.0.0.1", port=port, timeout=scaled(30), agree=agree
            )
            sessions[r] = session
            listening.set()
            for step, indices, weight, _ in session.steps(0):
                got[r].append((step, indices, weight))
                session.report(float(scheduler.sizes[indices].sum()) * 1e-6 * (3 if r else 1))
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            listening.set()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=scaled(120))
    try:
        assert not errors and not any(t.is_alive() for t in threads), errors
        assert [s for s, *_ in got[0]] == [s for s, *_ in got[1]] == list(range(static.num_steps))
        for (step, a, wa), (_, b, wb) in zip(got[0], got[1], strict=True):
            assert Counter(a.tolist()) + Counter(b.tolist()) == _step_samples(static, step)
            assert wa + wb == pytest.approx(2.0)
        assert sessions[0].windows_dynamic == sessions[1].windows_dynamic > 0
        late = [len(b) for _, b, _ in got[1][-WINDOW:]], [len(a) for _, a, _ in got[0][-WINDOW:]]
        assert np.mean(late[0]) < np.mean(late[1])
    finally:
        for session in sessions:
            if session is not None:
                session.close()


def test_without_a_coordinator_every_window_is_the_static_plan():
    # Rank 1 of 2, nobody listening: every window times out to the static plan.
    scheduler = _scheduler(2, n=80)
    session = DynamicSession(scheduler, 1, host="127.0.0.1", port=free_ports(2)[0], timeout=0.2)
    try:
        static = scheduler.plan_epoch(0)
        steps = list(session.steps(0))
        for step, indices, weight, _ in steps:
            np.testing.assert_array_equal(indices, static.local(step, 1))
            assert weight == static.loss_weights[step, 1]
        assert len(steps) == static.num_steps
        assert session.windows_static == -(-static.num_steps // WINDOW)
        assert session.windows_dynamic == 0
    finally:
        session.close()


def test_a_static_configuration_opens_no_session():
    with pytest.raises(ValueError, match="kind='dynamic'"):
        DynamicSession(Scheduler(np.ones(20), ScheduleConfig(2, 4)), 0)


@pytest.fixture(scope="module")
def scheduler() -> Scheduler:
    """4 ranks, windows of 4 steps, 2000 samples of log-normal sizes."""
    sizes = np.random.default_rng(0).lognormal(5, 1, 2000)
    config = ScheduleConfig(
        num_replicas=4, batch_size=64, kind="dynamic", variable_batch=True, window=4
    )
    return Scheduler(sizes, config)


@pytest.mark.parametrize("coordinators", ["one", "two"])
def test_ranks_use_a_window_only_if_all_hold_the_same_planning_of_it(coordinators):
    """Two coordinators plan the same windows differently (each has its own generation, as
    a restarted coordinator has): ranks served by different ones must not mix their plans,
    or a step would train some samples twice and others never."""
    sizes = np.random.default_rng(1).lognormal(5, 1, 600)
    config = ScheduleConfig(num_replicas=2, batch_size=32, kind="dynamic", variable_batch=True)
    scheduler = Scheduler(sizes, config)
    port, other = free_ports(2)[0], free_ports(2)[0]
    total = ThreadTotal(2)
    with Coordinator(scheduler, "127.0.0.1", other) as second:
        # The second coordinator hears that rank 1 is slow; the first hears nothing.
        for step in range(scheduler.num_steps()):
            second.planner.observe(1, step, 1.0, 3.0)
        sessions: list[DynamicSession] = []
        got: dict[int, list] = {}

        def run(rank: int) -> None:
            session = DynamicSession(
                scheduler,
                rank,
                host="127.0.0.1",
                port=other if rank == 1 and coordinators == "two" else port,
                agree=total.agreement(rank),
            )
            sessions.append(session)
            got[rank] = [(step, indices.tolist()) for step, indices, _, _ in session.steps(0)]

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(scaled(60))
        for session in sessions:
            session.close()
    static = scheduler.plan_epoch(0)
    for step in range(static.num_steps):
        both = sorted(got[0][step][1] + got[1][step][1])
        assert both == sorted(static.indices[static.bounds[step, 0] : static.bounds[step, -1]])
    windows = -(-static.num_steps // config.window)
    for session in sessions:
        if coordinators == "one":
            assert session.windows_dynamic == windows
        else:
            assert session.windows_static == windows


@pytest.mark.parametrize(
    "env, value",
    [
        ("CHRONICA_PORT", "http"),
        ("CHRONICA_PORT", "70000"),
        ("CHRONICA_COORDINATOR", "nohostport"),
        ("CHRONICA_COORDINATOR", "10.0.0.1:99999"),
        ("CHRONICA_COORDINATOR", ":5000"),
    ],
)
def test_environment_settings_are_checked(scheduler, monkeypatch, env, value):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=env):
        DynamicSession(scheduler, 1, timeout=0.1)


@pytest.mark.parametrize(
    "args, error, match",
    [
        (dict(rank=4), ValueError, "rank"),
        (dict(rank=-1), ValueError, "rank"),
        (dict(rank=None), TypeError, "rank"),
        (dict(rank=0, timeout=0.0), ValueError, "timeout"),
        (dict(rank=0, timeout=math.inf), ValueError, "timeout"),
        (dict(rank=0, agree="yes"), (TypeError, ValueError), "agree"),
        (dict(rank=1, port=-5), ValueError, "port"),
    ],
)
def test_session_arguments_are_checked_before_anything_starts(scheduler, args, error, match):
    with pytest.raises(error, match=match):
        DynamicSession(scheduler, **args)


def test_without_an_agreement_a_coordinator_answering_one_rank_costs_no_sample(caplog):
    """No agreement between two ranks (``agree=None``) and a coordinator that answers rank
    0 only: nothing proves both hold the same window, so both take the static plan for
    every window, every step holds its samples exactly once, and each rank says why."""
    scheduler = _scheduler(2, n=120)
    static = scheduler.plan_epoch(0)
    got: dict[int, list] = {}
    sessions: list[DynamicSession] = []
    dead = free_ports(2)[0]
    with caplog.at_level("WARNING", logger="chronica"):
        session0 = DynamicSession(scheduler, 0, host="127.0.0.1", port=0, timeout=scaled(5))
        session1 = DynamicSession(scheduler, 1, host="127.0.0.1", port=dead, timeout=0.2)
        sessions += [session0, session1]
        try:
            for rank, session in enumerate(sessions):
                got[rank] = [(step, indices.tolist()) for step, indices, _, _ in session.steps(0)]
        finally:
            for session in sessions:
                session.close()
    for step in range(static.num_steps):
        assert Counter(got[0][step][1]) + Counter(got[1][step][1]) == _step_samples(static, step)
    for session in sessions:
        assert session.windows_dynamic == 0
        assert session.windows_static == -(-static.num_steps // WINDOW)
    warned = [r.getMessage() for r in caplog.records if "agreement between ranks" in r.getMessage()]
    assert len(warned) == 2 and all("static plan" in m for m in warned)


def test_a_rank_without_plans_is_named_once_by_the_ranks_that_have_them(caplog):
    """Rank 1 cannot reach the coordinator (it says so itself, once); rank 0 holds every
    window's plan, the vote takes the static plan, and rank 0 says why once, naming the
    cause (another rank had no plan), not once per window."""
    scheduler = _scheduler(2, n=200)
    static = scheduler.plan_epoch(0)
    total = ThreadTotal(2)
    got: dict[int, list] = {}
    ports = {0: 0, 1: free_ports(2)[0]}  # rank 0 starts the coordinator; rank 1: nobody there
    sessions: list[DynamicSession] = []

    def run(rank: int) -> None:
        session = DynamicSession(
            scheduler,
            rank,
            host="127.0.0.1",
            port=ports[rank],
            timeout=0.3 if rank else scaled(10),
            agree=total.agreement(rank),
        )
        sessions.append(session)
        got[rank] = [(step, indices.tolist()) for step, indices, _, _ in session.steps(0)]

    with caplog.at_level("WARNING", logger="chronica"):
        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(scaled(120))
    for session in sessions:
        session.close()
    for step in range(static.num_steps):
        assert Counter(got[0][step][1]) + Counter(got[1][step][1]) == _step_samples(static, step)
    windows = -(-static.num_steps // WINDOW)
    assert windows >= 3 and all(s.windows_static == windows for s in sessions)
    rank0 = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("chronica: rank 0")
    ]
    told = [m for m in rank0 if "use the static plan on every rank" in m]
    assert len(told) == 1 and "1 other rank(s) had no plan from the coordinator" in told[0]
    assert not any("do not fit together" in m for m in rank0)
