"""Pipeline parallelism: one data-parallel replica's step as a pipeline schedule, simulated
exactly, and the order of its micro-batches that makes that step shortest.

A replica's model is cut into ``stages`` devices (``virtual_stages`` chunks per device for
the interleaved schedule, so ``stages · virtual_stages`` model chunks in all, chunk ``v`` of
device ``d`` being the ``v·stages + d``-th). Every micro-batch passes forward through every
chunk, then backward through them in reverse. A micro-batch of predicted cost ``c`` (its
forward and backward together, ``chronica.CostModel``) costs ``c / (stages ·
virtual_stages)`` on each chunk: forward ``1 / (1 + backward_ratio)`` of that, backward the
rest (the zero-bubble schedule splits the backward into equal halves: B, the gradient of the
input, which the previous chunk waits for, and W, the gradient of the weights, which nobody
waits for).

Each device runs its forwards and backwards in the order of the schedule family, every
operation as soon as its device is free and its input is done (communication is free):

``1f1b``
    PipeDream-flush / Megatron 1F1B: device ``d`` runs ``stages - d - 1`` forwards, then
    alternates one forward and one backward, then the remaining backwards.
``interleaved``
    Megatron's interleaved 1F1B (``virtual_stages >= 2``): forwards go through the device's
    chunks in groups of ``stages`` micro-batches, ``(stages - d - 1)·2 + (virtual_stages -
    1)·stages`` forwards of warm-up (all of them when there are exactly ``stages``
    micro-batches); needs a micro-batch count divisible by ``stages``.
``zero_bubble``
    ZB-H1 (Qi et al., 2023): 1F1B's order of forwards and input-gradient backwards, with
    each weight-gradient operation placed where the device, in a run with F = B = W,
    would otherwise wait for an input (or at the end): 1F1B's activation memory and, with
    equal costs and ``backward_ratio=2``, a third of its bubble. The order is fixed once
    (as zero-bubble runtimes run a precomputed schedule) and every operation still starts
    as soon as its device and its input allow.

Guarantees: ``pipeline_makespan`` is exact for that model and deterministic;
``equal_cost_bound`` is the makespan of the same total cost in equal micro-batches (for
1F1B ``(M + S - 1)·c̄/S``, interleaved ``(M + (S - 1)/V)·c̄/S``, ``c̄`` the mean cost);
``makespan_lower_bound`` no order beats; ``order_micro_batches`` returns a permutation
whose makespan is never above the given order's, nor above ascending and descending cost
order, with a bounded number of simulations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core import pipeline_kernels as kernels
from chronica.core.checks import check_int, check_number

__all__ = [
    "SCHEDULES",
    "Pipeline",
    "equal_cost_bound",
    "makespan_lower_bound",
    "order_budget",
    "order_micro_batches",
    "pipeline_makespan",
]

SCHEDULES = ("1f1b", "interleaved", "zero_bubble")
# Operations one default search simulates in all: about 2 ms of CPU.
_WORK = 1_000_000


@dataclass(frozen=True)
class Pipeline:
    """How one data-parallel replica's model is pipelined. Validated on construction: a wrong
    type raises ``TypeError``, a wrong value ``ValueError``, both naming the field.

    Args:
        stages: pipeline devices per replica, ``>= 1``.
        virtual_stages: model chunks per device, ``>= 1``; ``>= 2`` is the interleaved
            schedule.
        schedule: ``"1f1b"``, ``"interleaved"`` or ``"zero_bubble"`` (ZB-H1); default
            ``"interleaved"`` when ``virtual_stages >= 2``, else ``"1f1b"``.
        backward_ratio: a micro-batch's backward time over its forward time, ``> 0``
            (default 2.0, the usual transformer figure).

    Example::

        >>> pipe = Pipeline(stages=4, virtual_stages=2)
        >>> pipe, pipe.schedule, pipe.micro_batch_multiple, pipe.min_micro_batches
        (Pipeline(stages=4, virtual_stages=2), 'interleaved', 4, 4)
    """

    stages: int
    virtual_stages: int = 1
    schedule: str | None = None
    backward_ratio: float = 2.0

    def __post_init__(self) -> None:
        check_int("stages", self.stages, 1)
        check_int("virtual_stages", self.virtual_stages, 1)
        ratio = check_number("backward_ratio", self.backward_ratio, 0.0)
        if ratio <= 0:
            raise ValueError(f"backward_ratio={self.backward_ratio!r} must be > 0")
        object.__setattr__(self, "backward_ratio", ratio)
        object.__setattr__(self, "stages", int(self.stages))
        object.__setattr__(self, "virtual_stages", int(self.virtual_stages))
        schedule = self._default_schedule if self.schedule is None else self.schedule
        if not isinstance(schedule, str):
            raise TypeError(f"schedule={schedule!r} must be a string, one of {SCHEDULES}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} must be one of {SCHEDULES}")
        if schedule == "interleaved" and self.virtual_stages < 2:
            raise ValueError(
                "schedule='interleaved' needs virtual_stages >= 2; with one chunk per device "
                "use schedule='1f1b'"
            )
        if schedule != "interleaved" and self.virtual_stages > 1:
            raise ValueError(
                f"schedule={schedule!r} runs one chunk per device; virtual_stages="
                f"{self.virtual_stages} needs schedule='interleaved'"
            )
        object.__setattr__(self, "schedule", schedule)

    @property
    def _default_schedule(self) -> str:
        return "interleaved" if self.virtual_stages > 1 else "1f1b"

    def __repr__(self) -> str:
        """The fields that differ from their defaults, as a call that builds an equal
        ``Pipeline``."""
        shown = [f"stages={self.stages}"]
        if self.virtual_stages != 1:
            shown.append(f"virtual_stages={self.virtual_stages}")
        if self.schedule != self._default_schedule:
            shown.append(f"schedule={self.schedule!r}")
        if self.backward_ratio != 2.0:
            shown.append(f"backward_ratio={self.backward_ratio!r}")
        return f"Pipeline({', '.join(shown)})"

    @property
    def micro_batch_multiple(self) -> int:
        """The schedule's count rule: a replica's micro-batch count must be a multiple of
        this (``stages`` for the interleaved schedule, as Megatron requires; else 1)."""
        return self.stages if self.schedule == "interleaved" else 1

    @property
    def min_micro_batches(self) -> int:
        """The fewest micro-batches that fill the pipeline: ``stages``."""
        return self.stages

    def micro_batch_count(self, at_least: int) -> int:
        """The smallest count allowed by both rules that is ``>= at_least``.

        Args:
            at_least: the count the tokens need, ``>= 1``.

        Example::

            >>> Pipeline(stages=4, virtual_stages=2).micro_batch_count(9)
            12
        """
        need = max(check_int("at_least", at_least, 1), self.min_micro_batches)
        step = self.micro_batch_multiple
        return -(-need // step) * step

    def to_tuple(self) -> tuple[Any, ...]:
        """Every field, in a stable order (for digests)."""
        return (self.stages, self.virtual_stages, self.schedule, self.backward_ratio)

    @property
    def _units(self) -> tuple[float, float, float]:
        """Time per unit of cost of one forward, one backward (B) and one weight-gradient
        (W) operation on one chunk."""
        chunks = self.stages * self.virtual_stages
        forward = 1.0 / ((1.0 + self.backward_ratio) * chunks)
        backward = self.backward_ratio * forward
        if self.schedule == "zero_bubble":
            return forward, backward / 2, backward / 2
        return forward, backward, 0.0


def _check_costs(costs: Any, pipeline: Pipeline) -> np.ndarray:
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"pipeline={pipeline!r} must be a chronica.core.pipeline.Pipeline")
    out = np.ascontiguousarray(costs, dtype=np.float64)
    if out.ndim != 1 or out.shape[0] == 0:
        raise ValueError(
            f"costs must be a non-empty 1-D array (one per micro-batch), got {costs!r}"
        )
    if not (np.isfinite(out).all() and (out >= 0).all()):
        raise ValueError("costs must be finite and >= 0 (a CostModel's predicted costs)")
    multiple = pipeline.micro_batch_multiple
    if out.shape[0] % multiple:
        raise ValueError(
            f"{out.shape[0]} micro-batches: {pipeline!r} needs a multiple of {multiple}; "
            f"plan {pipeline.micro_batch_count(out.shape[0])} (Pipeline.micro_batch_count)"
        )
    return out


def _program(pipeline: Pipeline, micro: int) -> kernels.Program:
    return kernels.program(pipeline.stages, pipeline.virtual_stages, str(pipeline.schedule), micro)


def _run(costs: np.ndarray, pipeline: Pipeline) -> float:
    """The makespan of ``costs`` (validated) in their order."""
    value = kernels.makespan(_program(pipeline, costs.shape[0]), costs, np.array(pipeline._units))
    assert value >= 0, f"{pipeline!r} deadlocked on {costs.shape[0]} micro-batches"
    return value


def pipeline_makespan(costs: Any, pipeline: Pipeline) -> float:
    """The time of one replica's pipelined step whose micro-batches, in this order, have
    these predicted costs (see the module docstring for the model). Exact for the model,
    deterministic, in the costs' unit.

    Args:
        costs: predicted cost per micro-batch, in execution order, finite and ``>= 0``; as
            many as ``pipeline.micro_batch_multiple`` allows.
        pipeline: the stages, virtual stages, schedule and backward ratio.

    Example::

        >>> pipeline_makespan([3.0, 3.0, 3.0, 3.0], Pipeline(stages=4))  # (4 + 3) · 3 / 4
        5.25
    """
    return _run(_check_costs(costs, pipeline), pipeline)


def equal_cost_bound(costs: Any, pipeline: Pipeline) -> float:
    """The makespan if the same total cost came in equally costly micro-batches (as many as
    ``costs``): ``(M + S - 1)·c̄/S`` for 1F1B, ``(M + (S - 1)/V)·c̄/S`` interleaved and
    ``(M + (S - 1)/(1 + r))·c̄/S`` zero-bubble (``r`` the backward ratio, ``M >= S``), the
    figure a pipeline's bubble is quoted against. Unequal costs can do better than it
    (small micro-batches where the pipeline fills and drains) or worse.

    Args:
        costs: predicted cost per micro-batch, finite and ``>= 0``.
        pipeline: the stages, virtual stages, schedule and backward ratio.

    Example::

        >>> equal_cost_bound([1.0, 5.0, 3.0, 3.0], Pipeline(stages=4))
        5.25
    """
    costs = _check_costs(costs, pipeline)
    return _run(np.full(costs.shape[0], costs.mean()), pipeline)


def makespan_lower_bound(costs: Any, pipeline: Pipeline) -> float:
    """A makespan that no order of these micro-batches beats: the larger of the longest
    micro-batch's own chain (forward through every chunk, backward through every chunk)
    and the last device's share of the work after the cheapest forward reaches it (for
    1F1B and interleaved, plus the cheapest backward's way back to the first device).
    Equals ``equal_cost_bound`` for equal costs under 1F1B and interleaved.

    Args:
        costs: predicted cost per micro-batch, finite and ``>= 0``.
        pipeline: the stages, virtual stages, schedule and backward ratio.

    Example::

        >>> makespan_lower_bound([1.0, 5.0, 3.0, 3.0], Pipeline(stages=4))  # the 5.0 chain
        5.0
    """
    costs = _check_costs(costs, pipeline)
    forward, backward, weight = pipeline._units
    stages, chunks = pipeline.stages, pipeline.stages * pipeline.virtual_stages
    chain = float(costs.max()) * (chunks * (forward + backward) + weight)
    cheapest = float(costs.min())
    ramp = (stages - 1) * cheapest * (forward + (0.0 if weight else backward))
    return max(chain, ramp + float(costs.sum()) / stages)


def _mountain(ranked: np.ndarray) -> np.ndarray:
    """``ranked``'s items dealt alternately to the front and the back: the first two end up
    at the two ends, the last in the middle."""
    out = np.empty_like(ranked)
    half = (ranked.shape[0] + 1) // 2
    out[:half] = ranked[0::2]
    out[half:] = ranked[1::2][::-1]
    return out


def _starts(costs: np.ndarray, pipeline: Pipeline) -> np.ndarray:
    """The orders the search starts from: the given one, ascending and descending cost,
    the cheapest at both ends rising to the dearest in the middle (and the reverse), and,
    with groups of ``stages`` micro-batches (interleaved), groups of similar cost arranged
    the same ways."""
    m = costs.shape[0]
    up = np.argsort(costs, kind="stable")
    orders = [np.arange(m), up, up[::-1], _mountain(up), _mountain(up[::-1])]
    group = pipeline.micro_batch_multiple
    if group > 1 and m > group:
        blocks = up.reshape(-1, group)
        orders += [blocks[_mountain(np.arange(blocks.shape[0]))].ravel()]
        orders += [blocks[_mountain(np.arange(blocks.shape[0]))][:, ::-1].ravel()]
    return np.ascontiguousarray(np.array(orders, dtype=np.int64))


def order_budget(micro: int, pipeline: Pipeline) -> int:
    """The simulations ``order_micro_batches`` runs at most by default for ``micro``
    micro-batches: about 2 ms of CPU, the same count on every machine.

    Args:
        micro: micro-batches, ``>= 1``.
        pipeline: the stages, virtual stages, schedule and backward ratio.

    Example::

        >>> order_budget(64, Pipeline(stages=8))  # 1024 operations per simulation
        976
    """
    prog = _program(pipeline, check_int("micro", micro, 1))
    return max(1, _WORK // prog.kind.size)


def order_micro_batches(costs: Any, pipeline: Pipeline, budget: int | None = None) -> np.ndarray:
    """A permutation of the micro-batches (positions into ``costs``) to run them in, chosen
    to shorten ``pipeline_makespan``. With few micro-batches (``M!`` simulations within the
    budget) every order is tried and the best returned. Otherwise: the best of a few
    orders (the given one, ascending, descending, cheapest at the ends and dearest in the
    middle or the reverse, and for the interleaved schedule the same over groups of
    ``stages``), then improved by swaps that shorten the simulated makespan.
    Deterministic; never worse than the given order, ascending or descending cost order.

    Args:
        costs: predicted cost per micro-batch (the plan's order), finite and ``>= 0``.
        pipeline: the stages, virtual stages, schedule and backward ratio.
        budget: simulations at most (default: about 2 ms of CPU for 64 micro-batches on 8
            stages, the same count whatever the machine).

    Example::

        >>> costs, pipe = np.array([4.0, 4.0, 1.0, 1.0]), Pipeline(stages=4)
        >>> order = order_micro_batches(costs, pipe)
        >>> order.tolist(), round(pipeline_makespan(costs, pipe), 3)
        ([2, 3, 0, 1], 5.333)
        >>> round(pipeline_makespan(costs[order], pipe), 3)  # the cheap ones fill the pipe
        5.167
    """
    costs = _check_costs(costs, pipeline)
    prog = _program(pipeline, costs.shape[0])
    starts = _starts(costs, pipeline)
    budget = order_budget(costs.shape[0], pipeline) if budget is None else budget
    budget = check_int("budget", budget, 1)
    return kernels.search(prog, starts, costs, np.array(pipeline._units), budget)
