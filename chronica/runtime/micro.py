"""Packed micro-batches on a rank: what a face hands out, from a static plan's layout or
from the pieces a coordinator's window lists."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from chronica.core.packing import Packing, Pieces
from chronica.core.plan import EpochPlan

__all__ = ["MicroBatch", "check_micro_batch", "micro_batch", "planned_micro_batches"]


class MicroBatch(NamedTuple):
    """One packed micro-batch of a rank (``ScheduleConfig(packing=...)``): tokens
    ``starts[i] .. starts[i] + lengths[i]`` of document ``indices[i]`` go in row ``rows[i]``,
    rows filled in order.

    Args:
        indices: the documents of the entries (int64).
        starts: each entry's first token in its document.
        lengths: each entry's token count.
        rows: each entry's row in the micro-batch (``[0, Packing.rows)``).
        loss_weight: turns the micro-batch's mean loss (per token or per document, as
            ``Packing.loss`` says) into its share of the step's global mean (0 when empty).

    Example::

        >>> batch = MicroBatch(np.array([7]), np.array([0]), np.array([12]), np.array([0]), 0.5)
        >>> batch.lengths.sum()  # tokens 0..11 of document 7, in row 0
        12
    """

    indices: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    rows: np.ndarray
    loss_weight: float


def micro_batch(table: Pieces, pieces: np.ndarray, rows: np.ndarray, weight: float) -> MicroBatch:
    """The micro-batch of ``pieces`` laid in ``rows``: each piece's document, first token and
    length read from ``table``.

    Args:
        table: the job's pieces (``Scheduler.pieces``).
        pieces: piece numbers in ``table``, one per entry.
        rows: each entry's row, aligned with ``pieces``.
        weight: the micro-batch's loss weight.

    Example::

        >>> micro_batch(scheduler.pieces, np.array([3, 4]), np.array([0, 0]), 1.0)
    """
    if len(pieces) != len(rows):
        raise ValueError(
            f"pieces and rows must align: got {len(pieces)} pieces and {len(rows)} rows"
        )
    return MicroBatch(table.doc[pieces], table.start[pieces], table.length[pieces], rows, weight)


def planned_micro_batches(plan: EpochPlan, step: int, rank: int) -> tuple[MicroBatch, ...]:
    """Rank ``rank``'s micro-batches of ``step`` in a packed plan: ``num_micro[step]`` of
    them on every rank, together exactly the rank's entries of the step, each with its
    weight from the plan's layout.

    Args:
        plan: a packed plan (``ScheduleConfig(packing=...)``; ``plan.micro`` is set).
        step: a step of ``plan``.
        rank: a rank of ``plan``.

    Example::

        >>> plan = Scheduler(sizes, ScheduleConfig(2, None, packing=packing)).plan_epoch(0)
        >>> [m.loss_weight for m in planned_micro_batches(plan, step=0, rank=1)]
    """
    layout = plan.micro
    if layout is None:
        raise ValueError(
            "plan is not packed: planned_micro_batches needs a plan of "
            "ScheduleConfig(packing=...); use plan.local(step, rank) for an unpacked one"
        )
    first = layout.index(step, rank)
    out = []
    for j in range(first, first + int(layout.num_micro[step])):
        span = slice(layout.bounds[j], layout.bounds[j + 1])
        out.append(
            MicroBatch(
                plan.indices[span],
                layout.starts[span],
                layout.lengths[span],
                layout.rows[span],
                float(layout.weights[j]),
            )
        )
    return tuple(out)


def check_micro_batch(batch: MicroBatch, packing: Packing) -> str | None:
    """Why ``batch`` breaks ``packing``'s caps (a row that does not exist, a row over its
    length; together these keep it within ``max_tokens``), or ``None``.

    Args:
        batch: the micro-batch to check (from a coordinator's window, say).
        packing: the caps it must keep (``ScheduleConfig.packing``).

    Example::

        >>> check_micro_batch(batch, Packing(256, row_length=128))  # None: within the caps
    """
    if batch.rows.shape[0] and (batch.rows.min() < 0 or batch.rows.max() >= packing.rows):
        return f"a row outside the {packing.rows} rows of a micro-batch"
    filled = np.bincount(batch.rows, weights=batch.lengths, minlength=packing.rows)
    if filled.max(initial=0) > packing.length:
        return f"a row of {int(filled.max())} tokens (row_length={packing.length})"
    # Rows in range and none over its length: at most rows * row_length <= max_tokens tokens.
    return None
