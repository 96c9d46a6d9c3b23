"""The second construction of ``balance="micro"``: a lockstep LPT that the kernel
(``chronica.core.packing.lockstep``) tries beside its ladder greedy on steps small enough,
keeping whichever plan is shorter.

Units by descending cost, each to the cell (rank, micro-batch) with room for it whose
placement raises its micro-batch's maximum time least; among those, the one whose rank's
time (the sum of its cells over its speed) is lowest after, then the lower micro-batch, then
the lower rank. While as many units are left as cells are empty, only empty cells are
candidates, so no cell is empty where the step has a unit for each. Where the ladder greedy
fills the gaps below a maximum best-fit first, this spreads each rank's load, which wins on
some steps with many long documents. On ranks of one speed, each unit walks the ranks by
ascending sum (kept sorted as they grow), looking at each rank's cells; the walk ends past
the first cell where the unit raises no maximum and the ranks tied with it, as no later cell
can come first (ranks of several speeds are walked in rank order, skipping those that cannot
come first). Only while every placement raises a maximum does it look at every cell, so the
kernel runs it where ``units × cells`` is at most ``2**24``. A pure-Python twin (the plain
scan of every cell) is in ``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import fit_row, largest_room
from chronica.core.packing.ladder import climb, rung, speed_classes

__all__ = ["lpt_cells"]


@njit(cache=True)
def lpt_cells(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    row_length: int,
    row_docs: int,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
) -> bool:
    """Place the units on the ``cells.shape`` grid (module docstring); ``False`` if a unit
    fits nowhere (the outputs are then partial). Every output array is overwritten.

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit (they count against ``row_docs``).
        order: the units by descending cost (``chronica.core.kernels.argsort_descending``).
        speeds: ``float64`` relative speed per rank (``> 0``).
        row_length: tokens per row.
        row_docs: the most documents in one row.
        free: ``int64`` output ``(ranks, micro-batches, rows)``, free tokens of every row.
        slots: ``int64`` output, like ``free``: documents every row can still take.
        rank: ``int64`` output, every unit's rank.
        micro: ``int64`` output, every unit's micro-batch.
        row: ``int64`` output, every unit's row.
        cells: ``float64`` output ``(ranks, micro-batches)``, every cell's cost.

    Example::

        >>> free, slots = np.empty((2, 1, 1), np.int64), np.empty((2, 1, 1), np.int64)
        >>> rank, micro, row = (np.empty(3, np.int64) for _ in range(3))
        >>> cells = np.empty((2, 1))
        >>> lpt_cells(np.array([6, 5, 1]), np.array([6.0, 5.0, 1.0]), np.ones(3, np.int64),
        ...           np.arange(3), np.ones(2), 16, 4, free, slots, rank, micro, row, cells)
        True
        >>> rank.tolist(), cells.ravel().tolist()
        ([0, 1, 1], [6.0, 6.0])
    """
    w, num_micro = cells.shape
    n = lengths.shape[0]
    free[:] = row_length
    slots[:] = row_docs
    cells[:, :] = 0.0
    room = np.full((w, num_micro), row_length if row_docs > 0 else -1, np.int64)
    count = np.zeros((w, num_micro), np.int64)
    sums = np.zeros(w)
    top = np.zeros(num_micro)
    empty = w * num_micro
    # Ranks of one speed walk in (sum, rank) order, which ``queue`` keeps; of several speeds,
    # in rank order, where the time after a unit does not grow along the walk.
    _, queue, size = speed_classes(speeds)
    sorted_walk = size.shape[0] == 1
    for t in range(n):
        i = order[t]
        cost = costs[i]
        forced = empty > 0 and n - t <= empty
        best_r, best_k, best_q = -1, -1, -1
        b_rise, b_after = np.inf, np.inf
        for x in range(w):
            r = queue[0, x] if sorted_walk else x
            after = (sums[r] + cost) / speeds[r]
            if b_rise == 0.0 and after > b_after:
                # No cell of this rank comes first; along a sorted walk, none of the rest.
                if sorted_walk:
                    break
                continue
            for k in range(num_micro):
                if room[r, k] < lengths[i] or (forced and count[r, k] > 0):
                    continue
                rise = max(0.0, (cells[r, k] + cost) / speeds[r] - top[k])
                if rise > b_rise or (
                    rise == b_rise
                    and (
                        after > b_after
                        or (after == b_after and (k > best_k or (k == best_k and r > best_r)))
                    )
                ):
                    continue
                q = fit_row(free[r, k], slots[r, k], lengths[i], docs[i])
                if q >= 0:
                    best_r, best_k, best_q, b_rise, b_after = r, k, q, rise, after
        if best_r < 0:
            return False
        r, k = best_r, best_k
        rank[i], micro[i], row[i] = r, k, best_q
        free[r, k, best_q] -= lengths[i]
        slots[r, k, best_q] -= docs[i]
        room[r, k] = largest_room(free[r, k : k + 1], slots[r, k : k + 1])
        if count[r, k] == 0:
            empty -= 1
        count[r, k] += 1
        cells[r, k] += cost
        if sorted_walk:
            x = rung(sums, queue[0], w, r)
            sums[r] += cost
            climb(sums, queue[0], w, x, r)
        else:
            sums[r] += cost
        top[k] = max(top[k], cells[r, k] / speeds[r])
    return True
