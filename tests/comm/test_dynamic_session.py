"""Scenario: the comm layer as ``chronica.runtime.session.DynamicSession`` drives it (real
coordinators and clients on loopback): ranks never mix two plannings of a window, and the
session checks its transport settings (ports, CHRONICA_COORDINATOR) before it starts any.

(These test the session's use of comm; they move beside ``runtime/session.py``'s own tests
once that module has a test file.)"""

import math
import threading

import numpy as np
import pytest
from thread_total import ThreadTotal
from workers import free_ports, scaled

from chronica.comm.coordinator import Coordinator
from chronica.core import ScheduleConfig, Scheduler
from chronica.runtime.session import DynamicSession


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
