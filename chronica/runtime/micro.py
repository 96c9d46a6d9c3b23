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
    rows filled in order; ``loss_weight`` turns its mean loss (per token or per document,
    as ``Packing.loss`` says) into its share of the step's global mean (0 when empty)."""

    indices: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    rows: np.ndarray
    loss_weight: float


def micro_batch(table: Pieces, pieces: np.ndarray, rows: np.ndarray, weight: float) -> MicroBatch:
    """The micro-batch of ``pieces`` (numbers in ``table``) laid in ``rows``."""
    return MicroBatch(table.doc[pieces], table.start[pieces], table.length[pieces], rows, weight)


def planned_micro_batches(plan: EpochPlan, step: int, rank: int) -> tuple[MicroBatch, ...]:
    """Rank ``rank``'s micro-batches of ``step`` in a packed plan."""
    layout = plan.micro
    assert layout is not None
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
    """Why ``batch`` breaks ``packing``'s caps (a row over its length, a row that does not
    exist, more tokens than ``max_tokens``), or ``None``."""
    if batch.rows.shape[0] and (batch.rows.min() < 0 or batch.rows.max() >= packing.rows):
        return f"a row outside the {packing.rows} rows of a micro-batch"
    filled = np.bincount(batch.rows, weights=batch.lengths, minlength=packing.rows)
    if filled.max(initial=0) > packing.length:
        return f"a row of {int(filled.max())} tokens (row_length={packing.length})"
    if filled.sum() > packing.max_tokens:
        return f"{int(filled.sum())} tokens (max_tokens={packing.max_tokens})"
    return None
