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

On larger steps a cheaper form runs (``spread_column``): the shed units alone move, each
(by descending cost) to the cell of another micro-batch whose maximum it raises least, the
least slack left below it next (best fit), then the lower micro-batch and rank; the best of
the levels is kept where it shortens the step.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import fit_row

__all__ = ["by_idle", "moving_units", "shed_column", "spread_column"]


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


@njit(cache=True)
def spread_column(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
    k: int,
    levels: int,
    budget: int,
) -> int:
    """Lower micro-batch ``k`` by ``shed_column`` with ``j = 1 .. levels`` (below the
    ranks), moving the shed units to cells of the other micro-batches (module docstring),
    and keep the ``j`` whose step (the sum of the micro-batches' costliest cells; ranks of
    one speed) is shortest, where it is shorter than before (the lower ``j`` on ties).
    Every array is updated in place where a ``j`` is kept. Stops trying after ``budget``
    units × cells looked at. Returns the looks spent.

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit.
        order: the units by descending cost (``chronica.core.kernels.argsort_descending``).
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        rank: every unit's rank.
        micro: every unit's micro-batch.
        row: every unit's row.
        cells: ``float64`` ``(ranks, micro-batches)`` every cell's cost.
        k: the micro-batch lowered.
        levels: the most cells lowered.
        budget: the most units × cells looked at.

    Example::

        >>> lengths, costs = np.array([4, 1, 1, 4]), np.array([4.0, 1.0, 1.0, 4.0])
        >>> rank, micro, row = np.array([0, 0, 1, 1]), np.array([0, 0, 0, 1]), np.zeros(4, np.int64)
        >>> cells = np.array([[5.0, 0.0], [1.0, 4.0]])
        >>> free = np.array([[[3], [8]], [[7], [4]]])
        >>> slots = np.full((2, 2, 1), 8)
        >>> looks = spread_column(lengths, costs, np.ones(4, np.int64), np.array([0, 3, 1, 2]),
        ...                       free, slots, rank, micro, row, cells, 0, 1, 100)
        >>> cells.tolist()  # the step: 5 + 4 before, 4 + 4 after
        [[4.0, 1.0], [1.0, 4.0]]
    """
    w, num_micro = cells.shape
    n = costs.shape[0]
    stay = np.empty(n, np.bool_)
    column = np.empty(w)
    top = np.empty(num_micro)
    trial_free, trial_slots = np.empty_like(free), np.empty_like(slots)
    trial_cells = np.empty_like(cells)
    to_rank = np.empty(n, np.int64)
    to_micro = np.empty(n, np.int64)
    to_row = np.empty(n, np.int64)
    best_total, best_j, looks = 0.0, 0, 0
    for k2 in range(num_micro):
        best_total += cells[:, k2].max()
    for j in range(1, min(levels, w - 1) + 1):
        if looks > budget:
            break
        total, spent = _spread(lengths, costs, docs, order, free, slots, rank, micro, row,
                               cells, k, j, stay, column, top, trial_free, trial_slots,
                               trial_cells, to_rank, to_micro, to_row)  # fmt: skip
        looks += spent
        if total < best_total:
            best_total, best_j = total, j
    if best_j == 0:
        return looks
    _spread(lengths, costs, docs, order, free, slots, rank, micro, row, cells, k, best_j,
            stay, column, top, trial_free, trial_slots, trial_cells, to_rank, to_micro,
            to_row)  # fmt: skip
    for i in range(n):
        if micro[i] == k and not stay[i]:
            rank[i], micro[i], row[i] = to_rank[i], to_micro[i], to_row[i]
    free[:] = trial_free
    slots[:] = trial_slots
    cells[:] = trial_cells
    return looks


@njit(cache=True)
def _spread(lengths, costs, docs, order, free, slots, rank, micro, row, cells, k, j, stay,
            column, top, trial_free, trial_slots, trial_cells, to_rank, to_micro,
            to_row):  # fmt: skip
    # One level of ``spread_column`` on the ``trial_`` arrays and ``to_`` places of the shed
    # units: ``(step after, looks)``, the step ``inf`` where a shed unit fits nowhere.
    w, num_micro = cells.shape
    shed_column(costs, rank, micro, cells, k, j, stay, column)
    trial_free[:] = free
    trial_slots[:] = slots
    trial_cells[:] = cells
    trial_cells[:, k] = column
    for i in range(costs.shape[0]):
        if micro[i] == k and not stay[i]:
            trial_free[rank[i], k, row[i]] += lengths[i]
            trial_slots[rank[i], k, row[i]] += docs[i]
    for k2 in range(num_micro):
        top[k2] = trial_cells[:, k2].max()
    looks = 0
    for i in order:
        if micro[i] != k or stay[i]:
            continue
        best_r, best_k, best_q = -1, -1, -1
        b_rise, b_slack = np.inf, np.inf
        for k2 in range(num_micro):
            if k2 == k:
                continue
            for r in range(w):
                looks += 1
                time = trial_cells[r, k2] + costs[i]
                rise = max(0.0, time - top[k2])
                slack = top[k2] - time if rise == 0.0 else 0.0
                if rise > b_rise or (rise == b_rise and slack >= b_slack):
                    continue
                q = fit_row(trial_free[r, k2], trial_slots[r, k2], lengths[i], docs[i])
                if q >= 0:
                    best_r, best_k, best_q, b_rise, b_slack = r, k2, q, rise, slack
        if best_r < 0:
            return np.inf, looks
        to_rank[i], to_micro[i], to_row[i] = best_r, best_k, best_q
        trial_free[best_r, best_k, best_q] -= lengths[i]
        trial_slots[best_r, best_k, best_q] -= docs[i]
        trial_cells[best_r, best_k] += costs[i]
        top[best_k] = max(top[best_k], trial_cells[best_r, best_k])
    total = 0.0
    for k2 in range(num_micro):
        total += top[k2]
    return total, looks
