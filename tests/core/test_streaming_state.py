"""StreamState: plain round trip, consumed positions, and reshard keeping every sample in
exactly one place."""

from dataclasses import replace

import numpy as np
import pytest

from chronica.core.packing import Packing
from chronica.core.streaming import (
    StreamState,
    consumed_positions,
    deal_lanes,
    plan_window,
    reshard,
)


def _state(world=2, consumed=0):
    lanes = tuple(deal_lanes([6, 5, 8, 4], world, seed=0, epoch=0, capacity=3))
    for lane in lanes:
        for _ in range(4):
            lane.offer(1000 + len(lane.buffer_ids), 7, None)
    ids = np.arange(50, 70)
    lengths = np.arange(1, 21)
    state = StreamState(world, 0, 3, 10, consumed, ids, lengths, ids % world, lanes)
    return state, plan_window(ids, lengths, world, Packing(max_tokens=40), batch_size=8)


def test_round_trip_and_version():
    state, _ = _state(consumed=1)
    again = StreamState.from_dict(state.to_dict())
    assert again.to_dict() == state.to_dict()
    assert "StreamState(world_size=2" in repr(again)
    with pytest.raises(ValueError, match="version"):
        StreamState.from_dict({**state.to_dict(), "version": 0})


def test_consumed_positions_follow_the_micro_batches():
    _, plan = _state()
    assert consumed_positions(plan, 0).size == 0
    everything = consumed_positions(plan, plan.num_micro)
    assert sorted(everything.tolist()) == list(range(sum(s.ids.shape[0] for s in plan.steps)))
    first = plan.steps[0]
    assert sorted(consumed_positions(plan, first.num_micro).tolist()) == list(
        range(first.ids.shape[0])
    )


@pytest.mark.parametrize("world", [1, 3, 5])
def test_reshard_puts_every_unconsumed_sample_somewhere_exactly_once(world):
    state, plan = _state(consumed=3)
    in_window = np.concatenate([s.ids for s in plan.steps])
    done = in_window[consumed_positions(plan, 3)]
    moved = reshard(state, plan, world, seed=0)
    rows = sorted((s, r) for lane in moved.lanes for s, a, b in lane.segments for r in range(a, b))
    old_rows = sorted(
        (s, r) for lane in state.lanes for s, a, b in lane.segments for r in range(a, b)
    )
    assert rows == old_rows and len(moved.lanes) == world
    buffered = [i for lane in state.lanes for i in lane.buffer_ids]
    assert sorted(moved.carry_ids.tolist() + done.tolist()) == sorted(
        state.pool_ids.tolist() + buffered
    )
    assert set(moved.carry_holders.tolist()) <= set(range(world))
    assert moved.pool_ids.size == 0 and moved.generation == 1 and moved.step > state.step


def test_measured_speeds_travel_in_the_state_and_a_new_world_drops_them():
    state, plan = _state(consumed=1)
    reports = np.array([[0, 2, 30, 500, 0.1], [1, 3, 40, 600, 0.3]])
    measured = replace(state, sequence=5, speeds=np.array([1.4, 0.6]), reports=reports)
    again = StreamState.from_dict(measured.to_dict())
    assert again.sequence == 5 and again.speeds.tolist() == [1.4, 0.6]
    assert np.array_equal(again.reports, reports)
    older = {k: v for k, v in state.to_dict().items() if k not in ("speeds", "reports")}
    assert StreamState.from_dict(older).speeds.shape == (0,)
    moved = reshard(measured, plan, 3, seed=0)
    assert moved.sequence == 5 and moved.speeds.shape == (0,) and moved.reports.shape == (0, 5)
