"""chronica.comm.horizon: a window is planned only within the horizon of the slowest rank,
never in an epoch the planner dropped; the refusals carry the code ``stale``."""

import numpy as np
import pytest

from chronica.comm.horizon import HORIZON_STEPS, Horizon
from chronica.comm.peers import Peers
from chronica.comm.protocol import ProtocolError
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.dynamic import DynamicPlanner
from chronica.core.packing import Packing


@pytest.fixture
def horizon(scheduler):
    peers = Peers(limit=16)
    return Horizon(DynamicPlanner(scheduler), peers)


def _at(horizon, epoch, step):
    horizon.peers.greet(b"rank-0", 0, 0)
    horizon.peers.moved(b"rank-0", epoch, step)


def test_before_any_rank_is_placed_every_live_window_passes(horizon):
    assert horizon.steps == max(4 * 4, HORIZON_STEPS) == 64
    for epoch, first in ((0, 0), (3, 0), (10**6, 0)):
        horizon.check(epoch, first)


def test_windows_within_the_horizon_pass_and_farther_ones_are_stale(horizon):
    _at(horizon, 0, 8)
    steps = horizon.epoch_steps(0)
    horizon.check(0, 8 + 64)
    horizon.check(0, 0)  # behind the job: the planner keeps those
    with pytest.raises(ProtocolError, match="more than 64 steps ahead") as error:
        horizon.check(2, 0)
    assert error.value.code == "stale"
    # The next epoch counts from the end of this one.
    room = 64 - (steps - 8)
    assert room > 0
    horizon.check(1, room)
    with pytest.raises(ProtocolError, match="ahead of the job"):
        horizon.check(1, room + 1)


def test_a_dropped_epoch_is_stale(scheduler):
    planner = DynamicPlanner(scheduler)
    horizon = Horizon(planner, Peers(limit=4))
    for epoch in range(3):  # planning later epochs drops the oldest
        planner.plan_window(epoch, 0)
    assert planner.forgotten >= 1
    with pytest.raises(ProtocolError, match="was dropped") as error:
        horizon.check(planner.forgotten - 1, 0)
    assert error.value.code == "stale"


def test_an_unpacked_epoch_has_the_schedulers_steps(horizon, scheduler):
    assert horizon.epoch_steps(None) == horizon.epoch_steps(5) == scheduler.num_steps()


def test_a_packed_epoch_far_ahead_is_refused_before_counting_it():
    sizes = np.clip(np.round(np.random.default_rng(2).lognormal(4, 1, 300)), 1, 256)
    packing = Packing(256, row_length=128, tokens_per_step=4000, long_documents="split")
    scheduler = Scheduler(sizes, ScheduleConfig(2, None, kind="dynamic", window=4, packing=packing))
    horizon = Horizon(DynamicPlanner(scheduler), Peers(limit=4))
    assert horizon.epoch_steps(None) == scheduler.num_steps(0)
    _at(horizon, 0, 0)
    assert horizon.epoch_steps(1) == scheduler.num_steps(1)  # the next: needed to place it
    with pytest.raises(ProtocolError, match="ahead of the job"):
        horizon.epoch_steps(5)
    assert "steps=64" in repr(horizon)
