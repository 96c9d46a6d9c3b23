"""The state of a streamed, packed epoch: global (every rank's part), so that any world
size can take it over.

At every window the ranks exchange, beside the lengths they buffered, their lanes' states
(``LaneState``: shard cursors, buffered ids, random draws), so every rank holds the same
``StreamState``: the epoch, the window's pool (carry-over first, then the ranks'
contributions, with the rank *holding* each sample's record), every lane as it stood once
the window's samples were taken, the micro-batches of the window every rank has consumed,
samples carried over to the next window by a change of world, and (``kind="dynamic"``) the
rank speeds the window was planned with and the step-time reports they were fitted from. A
sample is in exactly one place: consumed, in the window's unconsumed part, carried over, in
a lane's buffer, or in a lane's unread rows; so resuming keeps every sample of the pass
exactly once.

* Same world: every rank takes its lane back, the window is planned again from the pool
  (``plan_window`` is deterministic) and resumes at ``consumed``: bitwise the
  uninterrupted run.
* Another world (``reshard``): the window's unconsumed samples and every lane's buffered
  samples become carry-over (records fetched by id by the rank now holding them), and the
  lanes' unread row ranges are dealt round-robin to the new ranks' lanes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chronica.core.checks import check_int
from chronica.core.rng import derive_key
from chronica.core.streaming.lanes import LANE_STREAM, LaneState
from chronica.core.streaming.window import WindowPlan

__all__ = ["STREAM_STATE_VERSION", "StreamState", "consumed_positions", "reshard"]

STREAM_STATE_VERSION = 1


@dataclass(frozen=True, repr=False)
class StreamState:
    """Where a streamed run stands, for every rank at once (see the module docstring).

    Args:
        world_size: the ranks that made the window.
        epoch: the pass of the stream.
        window: the window's number within the epoch.
        step: global steps completed before the window (all epochs).
        consumed: micro-batches of the window every rank has consumed.
        pool_ids: ``int64`` the window's pool, in order.
        pool_lengths: ``int64`` their lengths.
        pool_holders: ``int64`` the rank holding each pool sample's record.
        lanes: every rank's lane once the window's samples were taken.
        carry_ids: samples carried over past the window (a change of world), in order.
        carry_lengths: their lengths.
        carry_holders: the rank holding each.
        generation: changes of world so far (keys of re-dealt lanes).
        sequence: the window's number since the stream began (all epochs; -1 before the
            first).
        speeds: ``float64`` the relative rank speeds the window was planned with
            (``kind="dynamic"``; empty: equal speeds).
        reports: ``float64`` ``(m, 5)`` the step-time reports the ranks exchanged so far
            that the speeds are fitted from (``rank, documents, tokens, squared tokens,
            seconds``; the newest ``history`` of every rank).

    Example::

        >>> state = StreamState(world_size=1, epoch=0, window=0, step=0, consumed=0,
        ...                     pool_ids=np.arange(2), pool_lengths=np.ones(2, np.int64),
        ...                     pool_holders=np.zeros(2, np.int64), lanes=())
        >>> StreamState.from_dict(state.to_dict()).to_dict() == state.to_dict()
        True
    """

    world_size: int
    epoch: int
    window: int
    step: int
    consumed: int
    pool_ids: np.ndarray
    pool_lengths: np.ndarray
    pool_holders: np.ndarray
    lanes: tuple[LaneState, ...]
    carry_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    carry_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    carry_holders: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    generation: int = 0
    sequence: int = -1
    speeds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    reports: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))

    @property
    def exhausted(self) -> bool:
        """Every lane read and drained: the window is the epoch's last."""
        return all(lane.remaining == 0 for lane in self.lanes)

    def to_dict(self) -> dict[str, Any]:
        """The state as plain integers and lists (JSON-, msgpack- and pickle-able)."""
        arrays = ("pool_ids", "pool_lengths", "pool_holders")
        carry = ("carry_ids", "carry_lengths", "carry_holders")
        return {
            "version": STREAM_STATE_VERSION,
            "world_size": self.world_size,
            "epoch": self.epoch,
            "window": self.window,
            "step": self.step,
            "consumed": self.consumed,
            "generation": self.generation,
            "sequence": self.sequence,
            "speeds": self.speeds.tolist(),
            "reports": self.reports.tolist(),
            **{name: getattr(self, name).tolist() for name in arrays + carry},
            "lanes": [lane.to_dict() for lane in self.lanes],
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> StreamState:
        """The state ``to_dict`` gave; ``ValueError`` for another version or a malformed
        state.

        Args:
            state: ``to_dict``'s output.
        """
        if not isinstance(state, dict) or state.get("version") != STREAM_STATE_VERSION:
            raise ValueError(
                f"not a stream state of version {STREAM_STATE_VERSION}: pass what "
                "state_dict() returned"
            )
        arrays = {
            name: np.asarray(state[name], dtype=np.int64).reshape(-1)
            for name in (
                "pool_ids", "pool_lengths", "pool_holders", "carry_ids", "carry_lengths",
                "carry_holders",
            )
        }  # fmt: skip
        return cls(
            world_size=int(state["world_size"]),
            epoch=int(state["epoch"]),
            window=int(state["window"]),
            step=int(state["step"]),
            consumed=int(state["consumed"]),
            lanes=tuple(LaneState.from_dict(lane) for lane in state["lanes"]),
            generation=int(state["generation"]),
            sequence=int(state.get("sequence", -1)),
            speeds=np.asarray(state.get("speeds", []), dtype=np.float64).reshape(-1),
            reports=np.asarray(state.get("reports", []), dtype=np.float64).reshape(-1, 5),
            **arrays,
        )

    def __repr__(self) -> str:
        """Where the state stands."""
        return (
            f"StreamState(world_size={self.world_size}, epoch={self.epoch}, "
            f"window={self.window}, step={self.step}, consumed={self.consumed}, "
            f"pool={self.pool_ids.shape[0]}, carry={self.carry_ids.shape[0]})"
        )


def consumed_positions(plan: WindowPlan, consumed: int) -> np.ndarray:
    """Positions (into the window's ``ids`` concatenated step after step) of the samples
    every rank has consumed after ``consumed`` micro-batches of the window: whole steps,
    and micro-batches ``< consumed`` of the step under way.

    Args:
        plan: the window's plan.
        consumed: micro-batches of the window consumed per rank.

    Example::

        >>> from chronica.core.packing import Packing
        >>> from chronica.core.streaming.window import plan_window
        >>> plan = plan_window(range(4), [1] * 4, 1, Packing(max_tokens=2), batch_size=4)
        >>> consumed_positions(plan, 1).tolist()
        [0, 2]
    """
    done = check_int("consumed", consumed, 0, plan.num_micro, hint=" (<= the window's)")
    out, base = [], 0
    for step in plan.steps:
        out.append(base + np.flatnonzero(step.micro < min(done, step.num_micro)))
        done -= step.num_micro
        base += step.ids.shape[0]
        if done <= 0:
            break
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def reshard(state: StreamState, plan: WindowPlan, world_size: int, seed: int) -> StreamState:
    """``state`` (whose window ``plan`` is) taken over by ``world_size`` ranks: the
    window's unconsumed samples, its carry-over, earlier carry-over and every lane's
    buffer become carry-over (held round-robin by the new ranks), and the lanes' unread
    row ranges are dealt round-robin to ``world_size`` new lanes with fresh keys. The pool
    is then empty (no window under way), ``step`` counts the window's steps begun, and the
    measured speeds and their reports, which were the old ranks', are dropped.

    Args:
        state: the saved state.
        plan: the plan of its window (``plan_window`` of its pool for its world size).
        world_size: the new ranks, ``>= 1``.
        seed: the run's seed (the new lanes' keys).

    Example::

        >>> from chronica.core.streaming.lanes import deal_lanes
        >>> lanes = tuple(deal_lanes([3, 3], 2, seed=0, epoch=0, capacity=1))
        >>> empty = np.zeros(0, np.int64)
        >>> state = StreamState(2, 0, 0, 0, 0, empty, empty, empty, lanes)
        >>> from chronica.core.packing import Packing
        >>> from chronica.core.streaming.window import plan_window
        >>> moved = reshard(state, plan_window(empty, empty, 2, Packing(max_tokens=4),
        ...                 batch_size=2), 3, seed=0)
        >>> [lane.segments for lane in moved.lanes]
        [[[1, 0, 3]], [[0, 0, 3]], []]
    """
    w = check_int("world_size", world_size, 1)
    in_window = np.concatenate([s.ids for s in plan.steps] or [np.zeros(0, np.int64)])
    done = set(in_window[consumed_positions(plan, state.consumed)].tolist())
    pool_left = [i for i, sample in enumerate(state.pool_ids.tolist()) if sample not in done]
    ids = [state.carry_ids, state.pool_ids[pool_left]]
    lengths = [state.carry_lengths, state.pool_lengths[pool_left]]
    for lane in state.lanes:
        ids.append(np.asarray(lane.buffer_ids, np.int64))
        lengths.append(np.asarray(lane.buffer_lengths, np.int64))
    carry_ids, carry_lengths = np.concatenate(ids), np.concatenate(lengths)
    segments = [list(s) for lane in state.lanes for s in lane.segments]
    capacity = state.lanes[0].capacity if state.lanes else 1
    generation = state.generation + 1
    firsts = np.cumsum([0] + [s.num_micro for s in plan.steps])[:-1]
    started = int(np.count_nonzero(firsts < state.consumed))
    lanes = tuple(
        LaneState(
            key=int(derive_key(seed, state.epoch, LANE_STREAM, generation + 1, r)),
            capacity=capacity,
            segments=segments[r::w],
        )
        for r in range(w)
    )
    empty = np.zeros(0, np.int64)
    return replace(
        state,
        world_size=w,
        step=state.step + started,
        consumed=0,
        pool_ids=empty,
        pool_lengths=empty,
        pool_holders=empty,
        lanes=lanes,
        carry_ids=carry_ids,
        carry_lengths=carry_lengths,
        carry_holders=np.arange(carry_ids.shape[0], dtype=np.int64) % w,
        generation=generation,
        speeds=np.zeros(0),
        reports=np.zeros((0, 5)),
    )
