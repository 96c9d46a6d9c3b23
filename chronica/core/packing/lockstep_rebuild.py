"""The rebuild pass of ``balance="micro"``: keep one micro-batch, lowered to a level, and plan
every other unit again into the other micro-batches.

The lockstep step is ``sum_k max_r C[r, k]``. Where long units meet a token cap, one
micro-batch (the one holding the costliest units) has cells that cannot all reach its
maximum, and the greedy that filled it first leaves a few cells above the rest: the moves
and trades of the leveling and the relief (one or two units at a time) do not undo that.
Here micro-batch ``k`` keeps its units, except that its ``j`` costliest cells shed their
cheapest units until they are no costlier than the ``j + 1``-th (``shed_column``); the shed
units and those of every other micro-batch are then planned again, from nothing, into
``num_micro - 1`` micro-batches by the kernel's own constructions
(``chronica.core.packing.lockstep``), and the result replaces the plan where its step is
shorter. The kernel drives the tries (micro-batches by descending idle time, ``j`` in 1, 2,
4, 8; the first shorter plan is kept and the tries start again) within a budget of tries
and of ``units × cells`` planned again, on ranks of one speed and small steps only: each
try costs about one plan of the step. Functions here select the units; a pure-Python twin
is in ``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["by_idle", "moving_units", "shed_column"]


@njit(cache=True)
def by_idle(cells: np.ndarray) -> np.ndarray:
    """The micro-batches by descending idle time (``sum_r (max_r C[r, k] - C[r, k])``, the
    time its cells wait for its slowest), ties to the lower micro-batch.

    Args:
        cells: ``float64`` ``(ranks, micro-batches)`` every cell's cost.

    Example::

        >>> by_idle(np.array([[4.0, 2.0, 1.0], [1.0, 2.0, 3.0]])).tolist()
        [0, 2, 1]
    """
    w, num_micro = cells.shape
    idle = np.zeros(num_micro)
    for k in range(num_micro):
        high = cells[:, k].max()
        for r in range(w):
            idle[k] += high - cells[r, k]
    return np.argsort(-idle, kind="mergesort")


@njit(cache=True)
def shed_column(
    costs: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    cells: np.ndarray,
    k: int,
    j: int,
    stay: np.ndarray,
    column: np.ndarray,
) -> None:
    """Lower micro-batch ``k``'s ``j`` costliest cells (ties: lower rank first) to the cost
    of the ``j + 1``-th: each sheds its units by ascending cost (ties: lower unit first)
    while it is costlier than that level and keeps more than one unit.

    Args:
        costs: ``float64`` predicted cost per unit.
        rank: every unit's rank.
        micro: every unit's micro-batch.
        cells: ``float64`` ``(ranks, micro-batches)`` every cell's cost.
        k: the micro-batch kept.
        j: how many of its cells are lowered, ``1 <= j < ranks``.
        stay: ``bool`` output, whether each unit stays in micro-batch ``k``.
        column: ``float64`` output ``(ranks,)``, micro-batch ``k``'s cells after.

    Example::

        >>> stay, column = np.empty(4, np.bool_), np.empty(2)
        >>> shed_column(np.array([5.0, 1.0, 2.0, 3.0]), np.array([0, 0, 0, 1]),
        ...             np.zeros(4, np.int64), np.array([[8.0], [3.0]]), 0, 1, stay, column)
        >>> stay.tolist(), column.tolist()
        ([True, False, False, True], [5.0, 3.0])
    """
    n = costs.shape[0]
    for i in range(n):
        stay[i] = micro[i] == k
    column[:] = cells[:, k]
    ranks = np.argsort(-cells[:, k], kind="mergesort")
    level = cells[ranks[j], k]
    mine = np.empty(n, np.int64)
    for x in range(j):
        r = ranks[x]
        count = 0
        for i in range(n):
            if stay[i] and rank[i] == r:
                mine[count] = i
                count += 1
        units = mine[:count][np.argsort(costs[mine[:count]], kind="mergesort")]
        y = 0
        while column[r] > level and count - y > 1:
            stay[units[y]] = False
            column[r] -= costs[units[y]]
            y += 1


@njit(cache=True)
def moving_units(order: np.ndarray, stay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The units planned again (those that do not stay), ascending, and their order for the
    constructions: ``order`` restricted to them, as positions in the first array.

    Args:
        order: all units by descending cost (``chronica.core.kernels.argsort_descending``).
        stay: ``bool`` per unit, ``True`` for those kept in place.

    Example::

        >>> moving = moving_units(np.array([2, 0, 3, 1]), np.array([False, True, False, False]))
        >>> [part.tolist() for part in moving]
        [[0, 2, 3], [1, 0, 2]]
    """
    n = stay.shape[0]
    where = np.full(n, -1, np.int64)
    count = 0
    for i in range(n):
        if not stay[i]:
            where[i] = count
            count += 1
    units = np.empty(count, np.int64)
    sub_order = np.empty(count, np.int64)
    t = 0
    for i in order:
        if where[i] >= 0:
            units[where[i]] = i
            sub_order[t] = where[i]
            t += 1
    return units, sub_order
