"""The simulator's pipeline model: every data-parallel rank is one pipelined replica, and its
load in a step is the makespan of its micro-batches under the schedule
(``chronica.core.pipeline``) instead of their sum.

A packed configuration's micro-batches are its plan's (``MicroLayout``), a micro-batch
costing the sum of its pieces' costs; any other configuration runs one sample per
micro-batch, in its plan's order (a micro-batch size of 1). A count the schedule does not
allow (interleaved: a multiple of ``stages``) is completed with empty micro-batches, the
slots a job must still run. With ``order``, every rank's micro-batches run in the order
``order_micro_batches`` picks, as a planner that knows the pipeline would run them.

Loads stay in cost units, so ``ComputeModel.seconds_per_cost`` turns them into seconds as
it does for a rank's sum: a replica with one stage and one micro-batch has the same load
either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chronica.core.checks import check_bool
from chronica.core.pipeline import Pipeline, order_micro_batches, pipeline_makespan
from chronica.core.plan import MicroLayout

__all__ = ["PipelineModel"]


@dataclass(frozen=True)
class PipelineModel:
    """How every rank's step is pipelined in a simulation.

    Args:
        pipeline: stages, virtual stages, schedule and backward ratio of every replica.
        order: whether each rank's micro-batches run in ``order_micro_batches``'s order
            (default) or in the plan's.

    Example::

        >>> model = PipelineModel(Pipeline(stages=4))
        >>> model.makespan(np.array([4.0, 4.0, 1.0, 1.0])) < model.makespan(
        ...     np.array([4.0, 4.0, 1.0, 1.0]), ordered=False)
        True
    """

    pipeline: Pipeline
    order: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.pipeline, Pipeline):
            raise TypeError(f"pipeline={self.pipeline!r} must be a chronica.core.pipeline.Pipeline")
        check_bool("order", self.order)

    def describe(self) -> dict[str, object]:
        """JSON-ready: the pipeline's fields and ``order``."""
        p = self.pipeline
        return {
            "stages": p.stages,
            "virtual_stages": p.virtual_stages,
            "schedule": p.schedule,
            "backward_ratio": p.backward_ratio,
            "order": self.order,
        }

    def makespan(self, costs: np.ndarray, ordered: bool | None = None) -> float:
        """One replica's pipelined step of micro-batches of ``costs`` (plan order), padded
        with empty micro-batches to a count the schedule allows, reordered when
        ``ordered`` (default: ``order``).

        Args:
            costs: cost per micro-batch, finite and ``>= 0``; empty: nothing to run.
            ordered: overrides ``order`` for this call.
        """
        if costs.shape[0] == 0:
            return 0.0
        step = self.pipeline.micro_batch_multiple
        padded = np.zeros(-(-costs.shape[0] // step) * step)
        padded[: costs.shape[0]] = costs
        if self.order if ordered is None else ordered:
            padded = padded[order_micro_batches(padded, self.pipeline)]
        return pipeline_makespan(padded, self.pipeline)

    def sample_loads(
        self, indices: np.ndarray, bounds: np.ndarray, costs: np.ndarray
    ) -> np.ndarray:
        """``(steps, W)`` makespans of a plan laid out as ``EpochPlan`` (rank r's samples at
        step s are ``indices[bounds[s, r] : bounds[s, r + 1]]``), one sample per
        micro-batch.

        Args:
            indices: the plan's sample order.
            bounds: ``(steps, W + 1)`` offsets into ``indices``.
            costs: cost of every sample.
        """
        per = costs[indices]
        steps, width = bounds.shape
        out = np.zeros((steps, width - 1))
        for s in range(steps):
            for r in range(width - 1):
                out[s, r] = self.makespan(per[bounds[s, r] : bounds[s, r + 1]])
        return out

    def packed_loads(self, micro: MicroLayout, entry_costs: np.ndarray, world: int) -> np.ndarray:
        """``(steps, W)`` makespans of a packed plan's micro-batches.

        Args:
            micro: the plan's ``MicroLayout``.
            entry_costs: cost of every entry of the plan (its piece's cost).
            world: ranks ``W``.
        """
        prefix = np.concatenate([[0.0], np.cumsum(entry_costs)])
        per_micro = prefix[micro.bounds[1:]] - prefix[micro.bounds[:-1]]
        steps = micro.num_micro.shape[0]
        out = np.zeros((steps, world))
        for s in range(steps):
            share = per_micro[micro.first[s] : micro.first[s + 1]].reshape(world, -1)
            for r in range(world):
                out[s, r] = self.makespan(share[r])
        return out
