"""Each rank's plan message of a planned window: what the coordinator publishes and answers.

One job: turn a core ``WindowPlan`` (every rank's samples of a window) into the
``protocol.plan_message`` bytes of each rank, under the coordinator's ``generation``. An
unpacked window's messages are encoded in one batch (``protocol.plan_messages``, byte for
byte what ``plan_message`` gives one rank); a packed window sends piece numbers and each
rank's micro-batches.
"""

from __future__ import annotations

import numpy as np

from chronica.comm.protocol import Micro, plan_message, plan_messages
from chronica.core.checks import check_int
from chronica.core.plan import WindowPlan

__all__ = ["PlanParts"]

_Layout = tuple[np.ndarray, np.ndarray, np.ndarray]


class PlanParts:
    """The per-rank messages of windows planned under ``generation``.

    Guarantees: ``part(plan, r, seq)`` holds exactly rank ``r``'s samples of each step of
    ``plan`` in order (with its loss weights and loads), and ``parts(plan, seq)[r] ==
    part(plan, r, seq)`` byte for byte.

    Args:
        generation: the planning the messages carry (``Coordinator.generation``), >= 1.

    Example::

        >>> parts = PlanParts(generation=7)
        >>> payloads = parts.parts(window_plan, seq=0)  # one bytes per rank
    """

    def __init__(self, generation: int) -> None:
        self.generation = check_int("generation", generation, 1)
        # The newest window's parts regrouped by rank (``_by_rank``), for its messages.
        self._layout: tuple[tuple[int, int], _Layout] | None = None

    def __repr__(self) -> str:
        return f"PlanParts(generation={self.generation})"

    def _by_rank(self, plan: WindowPlan) -> _Layout:
        """The window's indices regrouped rank by rank (each rank's steps in order), where
        each rank's run starts, and every rank's step offsets (a column each): one gather
        per window instead of a slice per step and rank."""
        key = (plan.epoch, plan.first_step)
        if self._layout is not None and self._layout[0] == key:
            return self._layout[1]
        counts = plan.counts.T.ravel()  # rank by rank, step by step
        starts = plan.bounds[:, :-1].T.ravel()
        ends = np.cumsum(counts)
        total = int(ends[-1]) if ends.size else 0
        gather = np.repeat(starts - (ends - counts), counts) + np.arange(total)
        runs = np.concatenate([[0], np.cumsum(plan.counts.sum(axis=0))])
        offsets = np.vstack([np.zeros((1, plan.num_replicas), np.int64), np.cumsum(plan.counts, 0)])
        layout = (plan.indices[gather], runs, offsets)
        self._layout = (key, layout)
        return layout

    def _unpacked(self, plan: WindowPlan, seq: int, ranks: slice) -> list[bytes]:
        """The messages of ``ranks`` (a slice of whole ranks) of an unpacked window."""
        grouped, runs, offsets = self._by_rank(plan)
        at = runs[ranks.start : ranks.stop + 1]
        return plan_messages(
            seq,
            self.generation,
            plan.epoch,
            plan.first_step,
            grouped[at[0] : at[-1]],
            at - at[0],
            offsets[:, ranks],
            plan.loss_weights[:, ranks],
            plan.loads[:, ranks],
        )

    def part(self, plan: WindowPlan, rank: int, seq: int) -> bytes:
        """Rank ``rank``'s message of ``plan``, numbered ``seq``.

        Args:
            plan: the planned window.
            rank: the rank, in ``[0, plan.num_replicas)``.
            seq: the window's sequence number (the coordinator's count of windows).
        """
        if plan.micro is None:
            return self._unpacked(plan, seq, slice(rank, rank + 1))[0]
        starts, ends = plan.bounds[:, rank], plan.bounds[:, rank + 1]
        spans = [slice(a, b) for a, b in zip(starts, ends, strict=True)]
        # A packed window sends piece numbers (documents and token ranges follow from them).
        layout = plan.micro
        indices = (
            np.concatenate([layout.pieces[span] for span in spans])
            if plan.num_steps
            else np.empty(0, np.int64)
        )
        offsets = np.concatenate([[0], np.cumsum(ends - starts)])
        counts = layout.num_micro
        first = layout.first[:-1] + rank * counts
        slots = np.concatenate([np.arange(a, a + m) for a, m in zip(first, counts, strict=True)])
        micro = Micro(
            rows=np.concatenate([layout.rows[span] for span in spans]),
            counts=counts,
            offsets=np.concatenate(
                [[0], np.cumsum(layout.bounds[slots + 1] - layout.bounds[slots])]
            ),
            weights=layout.weights[slots],
        )
        return plan_message(
            seq,
            self.generation,
            plan.epoch,
            plan.first_step,
            indices,
            offsets,
            plan.loss_weights[:, rank],
            plan.loads[:, rank],
            micro,
        )

    def parts(self, plan: WindowPlan, seq: int) -> list[bytes]:
        """Every rank's ``part`` of ``plan``, an unpacked window's in one batch.

        Args:
            plan: the planned window.
            seq: the window's sequence number.
        """
        if plan.micro is not None:
            return [self.part(plan, rank, seq) for rank in range(plan.num_replicas)]
        return self._unpacked(plan, seq, slice(0, plan.num_replicas))
