"""Epoch plans: which samples every rank trains on at every step, and what that costs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["EpochPlan", "PlanStats", "WindowPlan"]


@dataclass(frozen=True)
class EpochPlan:
    """Every (step, rank) -> sample indices for one epoch, plus predicted loads and weights.

    ``indices[bounds[s, r] : bounds[s, r + 1]]`` are rank ``r``'s samples at step ``s``;
    ``bounds[s, W]`` equals ``bounds[s + 1, 0]``, so a step's samples are contiguous.
    ``loss_weights[s, r] = n[s, r] * W / (samples in step s)``: scaling each rank's mean loss
    by it makes the all-reduced average gradient the mean over the whole step. Every rank has
    the same number of steps. Plans are plain numpy data; equal inputs give equal bytes.
    """

    epoch: int
    num_replicas: int
    indices: np.ndarray
    bounds: np.ndarray
    loads: np.ndarray
    num_padded: int
    num_dropped: int
    digest: str

    @property
    def num_steps(self) -> int:
        return int(self.bounds.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """Samples per (step, rank), shape ``(steps, W)``."""
        return np.diff(self.bounds, axis=1)

    @cached_property
    def loss_weights(self) -> np.ndarray:
        # Cached: adapters read one entry per step and rank.
        return _loss_weights(self.bounds, self.num_replicas)

    def local(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s sample indices at ``step`` (a read-only view)."""
        return self.indices[self.bounds[step, rank] : self.bounds[step, rank + 1]]

    def rank_indices(self, rank: int) -> np.ndarray:
        """All of rank ``rank``'s indices for the epoch, step after step."""
        if not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank={rank} must be in [0, {self.num_replicas})")
        return np.concatenate(
            [self.local(s, rank) for s in range(self.num_steps)] or [np.empty(0, np.int64)]
        )

    def rank_steps(self, rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s indices per step."""
        return [self.local(s, rank) for s in range(self.num_steps)]

    def stats(self, sizes: np.ndarray, costs: np.ndarray) -> PlanStats:
        """What this plan does to balance and padding, measured with the predicted ``costs``."""
        return PlanStats.of(self, sizes, costs)


@dataclass(frozen=True)
class WindowPlan:
    """Steps ``first_step .. first_step + num_steps - 1`` of one epoch, for every rank.

    A dynamic schedule is published window by window. Same layout as ``EpochPlan``, with
    step numbers counted from the start of the epoch: ``local(step, rank)`` for ``step`` in
    the window. ``loss_weights[i, r] = n[i, r] · W / (samples in the step)`` makes the
    all-reduced average gradient the mean over the step when local batches differ in size.
    """

    epoch: int
    first_step: int
    num_replicas: int
    indices: np.ndarray
    bounds: np.ndarray
    loads: np.ndarray
    digest: str

    @property
    def num_steps(self) -> int:
        return int(self.bounds.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """Samples per (step of the window, rank)."""
        return np.diff(self.bounds, axis=1)

    @cached_property
    def loss_weights(self) -> np.ndarray:
        # Cached: the coordinator reads one column per rank, W times per window.
        return _loss_weights(self.bounds, self.num_replicas)

    def local(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s sample indices at epoch step ``step`` (a read-only view)."""
        i = step - self.first_step
        if not 0 <= i < self.num_steps:
            raise ValueError(
                f"step {step} is outside this window ({self.first_step}.."
                f"{self.first_step + self.num_steps - 1})"
            )
        return self.indices[self.bounds[i, rank] : self.bounds[i, rank + 1]]


def _loss_weights(bounds: np.ndarray, num_replicas: int) -> np.ndarray:
    counts = np.diff(bounds, axis=1)
    totals = counts.sum(axis=1, keepdims=True)
    return counts * num_replicas / np.maximum(totals, 1)


@dataclass(frozen=True)
class PlanStats:
    """Diagnostics of one epoch's plan.

    ``load_ratio_*``: per-step max/mean predicted rank cost (1.0 is perfect balance; the
    step lasts as long as its slowest rank). ``bound_*``: the same for the best split any
    equal-count scheduler could reach for these steps, max(mean, largest sample)/mean.
    ``padding_fraction``: share of a local batch that is padding when every sample is padded
    to the longest one of its local batch. ``num_padded``/``num_dropped``: samples repeated
    or left out to give every rank the same count (torch's ``drop_last`` semantics).
    """

    epoch: int
    num_steps: int
    load_ratio_mean: float
    load_ratio_worst: float
    bound_mean: float
    bound_worst: float
    padding_fraction: float
    num_padded: int
    num_dropped: int

    @classmethod
    def of(cls, plan: EpochPlan, sizes: np.ndarray, costs: np.ndarray) -> PlanStats:
        if plan.num_steps == 0:
            return cls(plan.epoch, 0, 1.0, 1.0, 1.0, 1.0, 0.0, plan.num_padded, plan.num_dropped)
        loads = plan.loads
        mean = loads.mean(axis=1)
        safe = np.where(mean > 0, mean, 1.0)
        ratio = np.where(mean > 0, loads.max(axis=1) / safe, 1.0)
        step_start = plan.bounds[:, 0]
        step_len = plan.bounds[:, -1] - step_start
        largest = np.maximum.reduceat(costs[plan.indices], step_start) * (step_len > 0)
        bound = np.where(mean > 0, np.maximum(mean, largest) / safe, 1.0)
        return cls(
            epoch=plan.epoch,
            num_steps=plan.num_steps,
            load_ratio_mean=float(ratio.mean()),
            load_ratio_worst=float(ratio.max()),
            bound_mean=float(bound.mean()),
            bound_worst=float(bound.max()),
            padding_fraction=_padding_fraction(plan, sizes),
            num_padded=plan.num_padded,
            num_dropped=plan.num_dropped,
        )


def _padding_fraction(plan: EpochPlan, sizes: np.ndarray) -> float:
    starts = plan.bounds[:, :-1].ravel()
    counts = np.diff(plan.bounds, axis=1).ravel()
    keep = counts > 0
    starts, counts = starts[keep], counts[keep]
    s = sizes[plan.indices]
    longest = np.maximum.reduceat(s, starts)
    padded = float((longest * counts).sum())
    return 0.0 if padded == 0 else 1.0 - float(s.sum()) / padded
