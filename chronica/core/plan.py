"""Epoch plans: which samples every rank trains on at every step, and what that costs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["EpochPlan", "MicroLayout", "PlanStats", "WindowPlan"]


@dataclass(frozen=True)
class MicroLayout:
    """How a packed plan (``ScheduleConfig(packing=...)``) cuts every rank's share of a step
    into micro-batches, aligned with the plan's ``indices``.

    Entry ``e`` of the plan is tokens ``starts[e] .. starts[e] + lengths[e]`` of document
    ``indices[e]`` (a whole document unless it was split or truncated), in row ``rows[e]`` of
    its micro-batch; ``pieces[e]`` numbers that piece (``chronica.core.packing.Pieces``).
    At step ``s`` every rank runs ``num_micro[s]`` micro-batches; micro-batch ``m`` of rank
    ``r`` is entries ``bounds[j] .. bounds[j + 1]`` with ``j = first[s] + r·num_micro[s] + m``
    and weighs ``weights[j]`` in the loss (``chronica.core.packing.micro_weights``). Within a
    micro-batch, entries go row after row; ``capacity`` is a micro-batch's rows × row length.

    Args:
        pieces: ``int64`` piece number of every entry.
        starts: ``int64`` first token of every entry within its document.
        lengths: ``int64`` tokens of every entry.
        rows: ``int64`` row of every entry within its micro-batch.
        num_micro: ``int64`` micro-batches per rank, per step.
        first: ``int64`` flat number of every step's first micro-batch (one more than steps).
        bounds: ``int64`` where every micro-batch's entries start (one more than
            micro-batches).
        weights: ``float64`` loss weight of every micro-batch.
        capacity: tokens a micro-batch holds (rows × row length).
        delays: ``int64`` steps every entry's document waited (``Packing(outliers=...)``:
            how much later than the epoch's order put it), else ``None``.

    Example: ``Scheduler(sizes, ScheduleConfig(..., packing=Packing(...))).plan_epoch(0)
    .micro``; ``micro.index(s, r, m)`` numbers a micro-batch.
    """

    pieces: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    rows: np.ndarray
    num_micro: np.ndarray
    first: np.ndarray
    bounds: np.ndarray
    weights: np.ndarray
    capacity: int
    delays: np.ndarray | None = None

    def index(self, step: int, rank: int, micro: int = 0) -> int:
        """The flat number ``j`` of micro-batch ``micro`` of ``rank`` at ``step``.

        Args:
            step: the step.
            rank: the rank.
            micro: the micro-batch within the rank's share.
        """
        return int(self.first[step] + rank * self.num_micro[step] + micro)

    def rank_weights(self, num_replicas: int) -> np.ndarray:
        """Every rank's summed micro-batch weights per step, shape ``(steps, W)``: the weight
        of a rank's mean loss over all its tokens (or documents) of the step.

        Args:
            num_replicas: the world's ranks ``W``.
        """
        steps = self.num_micro.shape[0]
        out = np.zeros((steps, num_replicas))
        for s in range(steps):
            m = int(self.num_micro[s])
            out[s] = self.weights[self.first[s] : self.first[s + 1]].reshape(num_replicas, m).sum(1)
        return out


@dataclass(frozen=True)
class EpochPlan:
    """Every (step, rank) -> sample indices for one epoch, plus predicted loads and weights.

    ``indices[bounds[s, r] : bounds[s, r + 1]]`` are rank ``r``'s samples at step ``s``;
    ``bounds[s, W]`` equals ``bounds[s + 1, 0]``, so a step's samples are contiguous.
    ``loss_weights[s, r] = n[s, r] * W / (samples in step s)``: scaling each rank's mean loss
    by it makes the all-reduced average gradient the mean over the whole step. Every rank has
    the same number of steps. Plans are plain numpy data; equal inputs give equal bytes.

    A packed plan (``ScheduleConfig(packing=...)``) also has ``micro``, the micro-batches of
    every (step, rank); its ranks may hold different sample counts, and ``loss_weights`` is
    then each rank's share of the step's tokens (or documents) times ``W``.

    Args:
        epoch: the epoch.
        num_replicas: the world's ranks ``W``.
        indices: ``int64`` sample numbers, step after step, rank after rank.
        bounds: ``int64`` ``(steps, W + 1)``, where every rank's samples start.
        loads: ``float64`` ``(steps, W)``, every rank's predicted cost.
        num_padded: samples repeated to give every rank the same count.
        num_dropped: samples left out (``drop_last``).
        digest: the configuration digest the plan was made under.
        micro: the micro-batches of a packed plan, else ``None``.

    Example::

        >>> plan = EpochPlan(0, 2, np.array([3, 1, 0, 2]), np.array([[0, 1, 2], [2, 3, 4]]),
        ...                  np.ones((2, 2)), 0, 0, "d")
        >>> plan.local(1, 0).tolist(), plan.rank_indices(1).tolist()
        ([0], [1, 2])
    """

    epoch: int
    num_replicas: int
    indices: np.ndarray
    bounds: np.ndarray
    loads: np.ndarray
    num_padded: int
    num_dropped: int
    digest: str
    micro: MicroLayout | None = None

    @property
    def num_steps(self) -> int:
        """Steps of the epoch (the same on every rank)."""
        return int(self.bounds.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """Samples per (step, rank), shape ``(steps, W)``."""
        return np.diff(self.bounds, axis=1)

    @cached_property
    def loss_weights(self) -> np.ndarray:
        """Per (step, rank), the factor of the rank's mean loss (see the class docstring)."""
        # Cached: adapters read one entry per step and rank.
        if self.micro is not None:
            return self.micro.rank_weights(self.num_replicas)
        return _loss_weights(self.bounds, self.num_replicas)

    def local(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s sample indices at ``step`` (a view).

        Args:
            step: the step.
            rank: the rank.
        """
        return self.indices[self.bounds[step, rank] : self.bounds[step, rank + 1]]

    def rank_indices(self, rank: int) -> np.ndarray:
        """All of rank ``rank``'s indices for the epoch, step after step; ``ValueError`` for
        a rank outside ``[0, W)``.

        Args:
            rank: the rank.
        """
        if not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank={rank} must be in [0, {self.num_replicas})")
        return np.concatenate(
            [self.local(s, rank) for s in range(self.num_steps)] or [np.empty(0, np.int64)]
        )

    def rank_steps(self, rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s indices per step.

        Args:
            rank: the rank.
        """
        return [self.local(s, rank) for s in range(self.num_steps)]

    def stats(self, sizes: np.ndarray, costs: np.ndarray) -> PlanStats:
        """What this plan does to balance and padding, measured with the predicted ``costs``.

        Args:
            sizes: every sample's size (every piece's, for a packed plan).
            costs: every sample's predicted cost (every piece's, for a packed plan).
        """
        return PlanStats.of(self, sizes, costs)


@dataclass(frozen=True)
class WindowPlan:
    """Steps ``first_step .. first_step + num_steps - 1`` of one epoch, for every rank.

    A dynamic schedule is published window by window. Same layout as ``EpochPlan``, with
    step numbers counted from the start of the epoch: ``local(step, rank)`` for ``step`` in
    the window; a packed window's ``micro`` counts its steps from the window's first.
    ``loss_weights[i, r] = n[i, r] · W / (samples in the step)`` makes the all-reduced
    average gradient the mean over the step when local batches differ in size (packed: the
    rank's share of the step's tokens or documents, as in ``EpochPlan``).

    Args:
        epoch: the epoch.
        first_step: the epoch's step the window starts at.
        num_replicas: the world's ranks ``W``.
        indices: ``int64`` sample numbers, step after step, rank after rank.
        bounds: ``int64`` ``(steps, W + 1)``, where every rank's samples start.
        loads: ``float64`` ``(steps, W)``, every rank's predicted cost.
        digest: the configuration digest the window was planned under.
        micro: the micro-batches of a packed window, else ``None``.

    Example::

        >>> window = WindowPlan(0, 4, 2, np.array([5, 6, 7]), np.array([[0, 2, 3]]),
        ...                     np.ones((1, 2)), "d")
        >>> window.local(4, 0).tolist(), window.loss_weights.tolist()
        ([5, 6], [[1.3333333333333333, 0.6666666666666666]])
    """

    epoch: int
    first_step: int
    num_replicas: int
    indices: np.ndarray
    bounds: np.ndarray
    loads: np.ndarray
    digest: str
    micro: MicroLayout | None = None

    @property
    def num_steps(self) -> int:
        """Steps in the window."""
        return int(self.bounds.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """Samples per (step of the window, rank)."""
        return np.diff(self.bounds, axis=1)

    @cached_property
    def loss_weights(self) -> np.ndarray:
        """Per (step of the window, rank), the factor of the rank's mean loss."""
        # Cached: the coordinator reads one column per rank, W times per window.
        if self.micro is not None:
            return self.micro.rank_weights(self.num_replicas)
        return _loss_weights(self.bounds, self.num_replicas)

    def local(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s sample indices at epoch step ``step`` (a view); ``ValueError`` for
        a step outside the window.

        Args:
            step: the step, counted from the start of the epoch.
            rank: the rank.
        """
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
    to the longest one of its local batch (of a packed plan: share of its micro-batches'
    rows left empty). ``num_padded``/``num_dropped``: samples repeated or left out to give
    every rank the same count (torch's ``drop_last`` semantics). ``costs`` (and ``sizes``)
    are per sample, or per piece for a packed plan (``MicroLayout.pieces``), where the bound
    counts the largest piece instead of the equal-count bound's largest sample.

    Args:
        epoch: the epoch.
        num_steps: steps of the plan.
        load_ratio_mean: mean over steps of max/mean rank cost.
        load_ratio_worst: the worst step's max/mean rank cost.
        bound_mean: mean over steps of the best reachable ratio.
        bound_worst: the worst step's best reachable ratio.
        padding_fraction: share of padding (see above).
        num_padded: samples repeated.
        num_dropped: samples left out.
        delay_counts: with ``Packing(outliers=...)``, documents per delay: entry ``d`` counts
            the documents trained ``d`` steps after the step the epoch's order put them in
            (``delay_quantiles`` summarises it); else empty.

    Example: ``Scheduler(sizes, config).stats(epoch)``, or ``PlanStats.of(plan, sizes,
    costs)``.
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
    delay_counts: tuple[int, ...] = ()

    @property
    def delay_quantiles(self) -> dict[str, float]:
        """The delay in steps of the median, 90th, 99th percentile and last document
        (``p50``, ``p90``, ``p99``, ``max``) and the ``mean``; empty without delays."""
        counts = np.asarray(self.delay_counts, dtype=np.int64)
        if not counts.sum():
            return {}
        cumulative = np.cumsum(counts) / counts.sum()
        out = {f"p{q}": float(np.searchsorted(cumulative, q / 100)) for q in (50, 90, 99)}
        out["max"] = float(np.flatnonzero(counts)[-1])
        out["mean"] = float(np.dot(np.arange(counts.shape[0]), counts) / counts.sum())
        return out

    @classmethod
    def of(cls, plan: EpochPlan, sizes: np.ndarray, costs: np.ndarray) -> PlanStats:
        """The statistics of ``plan``.

        Args:
            plan: the epoch's plan.
            sizes: every sample's size (every piece's, for a packed plan).
            costs: every sample's predicted cost (every piece's, for a packed plan).
        """
        if plan.num_steps == 0:
            return cls(plan.epoch, 0, 1.0, 1.0, 1.0, 1.0, 0.0, plan.num_padded, plan.num_dropped)
        loads = plan.loads
        mean = loads.mean(axis=1)
        safe = np.where(mean > 0, mean, 1.0)
        ratio = np.where(mean > 0, loads.max(axis=1) / safe, 1.0)
        step_start = plan.bounds[:, 0]
        step_len = plan.bounds[:, -1] - step_start
        entries = plan.indices if plan.micro is None else plan.micro.pieces
        largest = np.maximum.reduceat(costs[entries], step_start) * (step_len > 0)
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
            delay_counts=_delay_counts(plan),
        )


def _delay_counts(plan: EpochPlan) -> tuple[int, ...]:
    """Documents per delay in steps (each document counted once, by its first piece)."""
    if plan.micro is None or plan.micro.delays is None:
        return ()
    first_pieces = plan.micro.starts == 0
    return tuple(int(c) for c in np.bincount(plan.micro.delays[first_pieces]))


def _padding_fraction(plan: EpochPlan, sizes: np.ndarray) -> float:
    if plan.micro is not None:
        room = float(plan.micro.weights.shape[0]) * plan.micro.capacity
        return 0.0 if room == 0 else 1.0 - float(plan.micro.lengths.sum()) / room
    starts = plan.bounds[:, :-1].ravel()
    counts = np.diff(plan.bounds, axis=1).ravel()
    keep = counts > 0
    starts, counts = starts[keep], counts[keep]
    s = sizes[plan.indices]
    longest = np.maximum.reduceat(s, starts)
    padded = float((longest * counts).sum())
    return 0.0 if padded == 0 else 1.0 - float(s.sum()) / padded
