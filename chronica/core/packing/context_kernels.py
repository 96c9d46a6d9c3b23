"""The numba kernel of context-parallel packing: documents placed onto ranks that already
carry load.

A context-parallel step is packed in two passes of the same kernel (``place_loaded``):
first the sharded documents onto the data-parallel groups (a group's rows are the rows
every CP rank of it holds, each sharded document taking ``1/g`` of its tokens and cost in
one row of every CP rank), then the whole documents onto the devices, starting from the
load and rows the sharded chunks left. Each pass is the rank kernel's LPT under row
capacities (``chronica.core.packing.kernels.pack_attempt``: costliest first, each to the
rank whose time after taking it is lowest among those with a row it fits in; there by
``fit_micro``), optionally followed by its refinement (``refine``, within a given work
bound), which only moves the documents of the pass. A pure-Python twin is in
``tests/helpers/cp_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import largest_room, lpt_place, refine

__all__ = ["place_loaded"]


@njit(cache=True)
def place_loaded(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    tight: bool,
    refined: bool,
    budget: int,
    free: np.ndarray,
    slots: np.ndarray,
    micro_loads: np.ndarray,
    loads: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
) -> bool:
    """Place documents onto ranks whose rows and loads are already partly taken: LPT under
    row capacities from the given state, then (with ``refined``) the rank kernel's
    refinement of these documents, looking at no more than ``budget`` candidates. ``False``
    if a document fits nowhere (the outputs are then partial). Every state array is updated
    in place.

    Args:
        lengths: ``int64`` tokens per document (per unit).
        costs: ``float64`` predicted cost per document.
        docs: ``int64`` documents per unit (counted against the rows' ``slots``).
        order: the documents by descending cost.
        speeds: ``float64`` relative speed per rank (``> 0``).
        tight: best fit (see ``fit_micro``).
        refined: run ``refine`` after the LPT pass.
        budget: the refinement's work bound (``work_budget(n, W)`` is the rank kernel's).
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        micro_loads: ``float64`` ``(ranks, micro-batches)`` cost of every micro-batch.
        loads: ``float64`` every rank's cost.
        rank: ``int64`` output, every document's rank.
        micro: ``int64`` output, every document's micro-batch.
        row: ``int64`` output, every document's row.

    Example::

        >>> free = np.full((2, 1, 1), 4, np.int64); free[0, 0, 0] = 2
        >>> slots = np.full((2, 1, 1), 4, np.int64)
        >>> loads = np.array([2.0, 0.0]); micro_loads = loads[:, None].copy()
        >>> rank, micro, row = (np.empty(2, np.int64) for _ in range(3))
        >>> place_loaded(np.array([2, 1]), np.array([2.0, 1.0]), np.ones(2, np.int64),
        ...              np.arange(2), np.ones(2), False, True, 1 << 22, free, slots,
        ...              micro_loads, loads, rank, micro, row)
        True
        >>> rank.tolist(), loads.tolist()
        ([1, 0], [3.0, 2.0])
    """
    w = speeds.shape[0]
    room = np.empty(w, np.int64)
    for r in range(w):
        room[r] = largest_room(free[r], slots[r])
    if not lpt_place(
        lengths, costs, docs, order, speeds, tight, free, slots, micro_loads, room, loads,
        rank, micro, row,
    ):  # fmt: skip
        return False
    if refined:
        refine(
            lengths, costs, docs, speeds, tight, free, slots, micro_loads, room, rank, micro,
            row, loads, budget,
        )  # fmt: skip
    return True
