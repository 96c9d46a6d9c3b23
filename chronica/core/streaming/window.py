"""``plan_window``: one bounded window of a streamed epoch planned for every rank at once.

A streamed epoch is never known whole: every rank reads its own shards. Every ``K`` global
batches the ranks pool the ``(id, length)`` pairs they buffered (plus the window's
carry-over, the samples an earlier window read but did not plan) and every rank calls
``plan_window`` on the same pool: the pool is cut into steps in its order (``batch_size``
samples per step, or ``Packing.tokens_per_step`` tokens, ``chronica.core.packing.step_starts``)
and each step is planned by ``chronica.plan_step``, the kernel of the map-style path (both
``balance`` objectives, caps, padding, pipeline order). A step of a window is therefore the
step the map-style planner makes for the same samples in the same order.

Guarantees: every rank runs the same number of micro-batches in a step; no micro-batch holds
more than ``max_tokens`` padded tokens; every pool sample is either planned exactly once or
carried over (a trailing step short of a full one, unless the window is ``final``); the plan
is a pure function of its arguments, so every rank computes the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.checks import check_int
from chronica.core.packing import Packing, plan_step, step_starts

__all__ = ["WindowPlan", "WindowStep", "plan_window"]


@dataclass(frozen=True, repr=False)
class WindowStep:
    """One planned step of a window: sample ``ids[i]`` runs on rank ``rank[i]``, micro-batch
    ``micro[i]`` of that rank, row ``row[i]`` of it; every rank runs ``num_micro``
    micro-batches.

    Args:
        ids: ``int64`` global sample ids, in the pool's order.
        lengths: ``int64`` tokens per sample (unpadded).
        rank: ``int64`` every sample's rank.
        micro: ``int64`` every sample's micro-batch within its rank.
        row: ``int64`` every sample's row within its micro-batch.
        num_micro: micro-batches per rank.
        micro_costs: ``float64`` ``(world_size, num_micro)`` predicted cost per micro-batch.
        weights: ``float64`` ``(world_size, num_micro)`` loss weight per micro-batch
            (``chronica.StepPlan.loss_weights``).

    Example::

        >>> plan = plan_window([7, 8, 9], [3, 2, 2], 2, Packing(max_tokens=4), batch_size=3,
        ...                    final=True)
        >>> step = plan.steps[0]
        >>> [s.tolist() for s in step.micro_batches(1)]
        [[8, 9]]
    """

    ids: np.ndarray
    lengths: np.ndarray
    rank: np.ndarray
    micro: np.ndarray
    row: np.ndarray
    num_micro: int
    micro_costs: np.ndarray
    weights: np.ndarray

    @property
    def world_size(self) -> int:
        """The ranks the step is planned for."""
        return int(self.micro_costs.shape[0])

    def positions(self, rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s micro-batches in execution order, each the positions (into
        ``ids``) of its samples, row after row (pool order within a row).

        Args:
            rank: a rank in ``0 .. world_size - 1``.
        """
        r = check_int("rank", rank, 0, self.world_size - 1, hint=" (< world_size)")
        mine = np.flatnonzero(self.rank == r)
        mine = mine[np.lexsort((mine, self.row[mine], self.micro[mine]))]
        cut = np.searchsorted(self.micro[mine], np.arange(1, self.num_micro))
        return np.split(mine, cut)

    def micro_batches(self, rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s micro-batches in execution order, each its samples' global ids.

        Args:
            rank: a rank in ``0 .. world_size - 1``.
        """
        return [self.ids[p] for p in self.positions(rank)]

    def __repr__(self) -> str:
        """The step's shape and figures."""
        loads = self.micro_costs.sum(1)
        return (
            f"WindowStep(samples={self.ids.shape[0]}, world_size={self.world_size}, "
            f"num_micro={self.num_micro}, max/mean={loads.max() / max(loads.mean(), 1e-300):.4g})"
        )


@dataclass(frozen=True, repr=False)
class WindowPlan:
    """A window's planned steps and what it carries over to the next window.

    Args:
        steps: the planned steps, in order.
        carry: ``int64`` positions (into the pool) of the samples carried over, in order.

    Example::

        >>> plan = plan_window(range(5), [1] * 5, 2, Packing(max_tokens=4), batch_size=2)
        >>> len(plan.steps), plan.carry.tolist()
        (2, [4])
    """

    steps: tuple[WindowStep, ...]
    carry: np.ndarray

    @property
    def num_micro(self) -> int:
        """Micro-batches per rank over the window's steps."""
        return sum(step.num_micro for step in self.steps)

    def __repr__(self) -> str:
        """The window's shape."""
        return (
            f"WindowPlan(steps={len(self.steps)}, num_micro={self.num_micro}, "
            f"carry={self.carry.shape[0]})"
        )


def plan_window(
    ids: Any,
    lengths: Any,
    world_size: int,
    packing: Packing,
    *,
    batch_size: int | None = None,
    final: bool = False,
    cost: Any = "linear",
    speeds: Any = None,
) -> WindowPlan:
    """Plan a window's pool (carry-over first, then what the ranks buffered, in a fixed
    order) for ``world_size`` ranks: steps cut in pool order and planned by
    ``chronica.plan_step``; the trailing step short of a full one is carried over unless
    ``final`` (then it is planned too: merged into the step before it when it has fewer
    samples than ranks, and with ranks left without samples only when the whole window
    has fewer samples than ranks).

    Args:
        ids: global sample ids of the pool (integers, distinct).
        lengths: tokens per sample, each at most ``packing.row_length`` once padded.
        world_size: the data-parallel ranks, ``>= 1``.
        packing: the cap, rows, objective and padding (``tokens_per_step``: steps of about
            that many tokens instead of ``batch_size`` samples).
        batch_size: samples per global step (needed without ``packing.tokens_per_step``).
        final: no more samples follow: plan the trailing partial step instead of carrying it.
        cost: predicted cost of a sample from its padded length (a ``chronica.CostModel`` or
            ``"linear"``/``"quadratic"``).
        speeds: relative speed per rank (measured, ``kind="dynamic"``); default equal.

    Example::

        >>> plan = plan_window([0, 1, 2, 3], [300, 200, 200, 100], 2, Packing(max_tokens=400),
        ...                    batch_size=4)
        >>> [s.micro_batches(0)[0].tolist() for s in plan.steps]
        [[0, 3]]
    """
    if not isinstance(packing, Packing):
        raise TypeError(f"packing must be a chronica.Packing, got {type(packing).__name__}")
    w = check_int("world_size", world_size, 1)
    pool = np.asarray(ids, dtype=np.int64).reshape(-1)
    tokens = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if pool.shape != tokens.shape:
        raise ValueError(
            f"ids and lengths must be as many, got {pool.shape[0]} and {tokens.shape[0]}"
        )
    if packing.tokens_per_step is None:
        b = check_int("batch_size", batch_size, 1, hint=" (samples per global step)")
        starts = step_starts(tokens, b, None)
        partial = starts.shape[0] > 1 and starts[-1] - starts[-2] < b
    else:
        starts = step_starts(tokens, None, packing.tokens_per_step)
        partial = starts.shape[0] > 1
    if partial and not final:
        return _planned(pool, tokens, starts[:-1], w, packing, cost, speeds, int(starts[-2]))
    if final and starts.shape[0] > 2 and starts[-1] - starts[-2] < w:
        starts = np.delete(starts, -2)  # too few for every rank: join the step before
    return _planned(pool, tokens, starts, w, packing, cost, speeds, pool.shape[0])


def _planned(
    pool: np.ndarray,
    tokens: np.ndarray,
    starts: np.ndarray,
    w: int,
    packing: Packing,
    cost: Any,
    speeds: Any,
    end: int,
) -> WindowPlan:
    steps = tuple(
        _plan_one(pool[a:b], tokens[a:b], w, packing, cost, speeds)
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)
        if b > a
    )
    return WindowPlan(steps, np.arange(end, pool.shape[0], dtype=np.int64))


def _plan_one(
    ids: np.ndarray, tokens: np.ndarray, w: int, packing: Packing, cost: Any, speeds: Any
) -> WindowStep:
    """One step by ``plan_step``; a step with fewer samples than ranks (only the very end
    of a stream that is smaller than the world) is planned for as many ranks as it has
    samples, the others running the same count of empty micro-batches."""
    ranks = min(w, ids.shape[0])
    speed = None if speeds is None else np.asarray(speeds, dtype=np.float64)[:ranks]
    plan = plan_step(tokens, ranks, packing, cost=cost, speeds=speed)
    costs, weights = plan.micro_costs, plan.micro_weights * w / ranks
    if ranks < w:
        # The ranks without samples run as many empty micro-batches, of weight 0.
        pad = ((0, w - ranks), (0, 0))
        costs, weights = np.pad(costs, pad), np.pad(weights, pad)
    return WindowStep(ids, tokens, plan.rank, plan.micro, plan.row, plan.num_micro, costs, weights)
