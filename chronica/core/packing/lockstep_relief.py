"""The relief pass of ``balance="micro"``: after the greedy and the leveling of every
micro-batch (``chronica.core.packing.lockstep``), trade units between micro-batches so that
slowest cells shed cost into other micro-batches' slack.

The lockstep step is ``sum_k max_r C[r, k] / speed[r]``. The leveling only trades within a
micro-batch; here, micro-batch after micro-batch (and again while a sweep changed a cell),
a unit ``i`` of the micro-batch's slowest cell ``a`` trades places with a cheaper unit
``j`` of *another* micro-batch ``kk``, in cell ``b``, where ``b`` takes the difference
without rising above ``kk``'s maximum. Among the ``_SCAN`` next-cheaper units of each unit
of ``a`` (by the step's descending cost order), the trade taken lowers ``a``'s micro-batch
most, then leaves ``b`` with the least slack below its maximum (best fit), then the lower
time, micro-batch and rank (``ladder.cell_before``). A trade where ``a`` ties with another
cell at the maximum is taken only where ``b`` stays strictly below its own, so every trade
lowers (sum of maxima, cells at a maximum) and the pass ends; it also ends after ``budget``
looks at a candidate unit, so its time is bounded by the step's size. Trades keep every
cell's unit count (no cell empties) and each unit's row slot only where the row has room.

The slowest cell of a micro-batch is the top rung of its speed classes' ladders
(``chronica.core.packing.ladder``): the costliest time, ties to the lower class, and within
a class to the higher rank. A pure-Python twin is in ``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.ladder import cell_before, climb, rung, sink, speed_classes

__all__ = ["relieve_columns"]

# Next-cheaper units (in the step's cost order) a unit of a slowest cell looks at.
_SCAN = 64


@njit(cache=True)
def relieve_columns(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
    budget: int,
) -> int:
    """Trade units between micro-batches (module docstring); every array is updated in
    place. Returns the number of trades.

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit.
        order: the units by descending cost (``chronica.core.kernels.argsort_descending``).
        speeds: ``float64`` relative speed per rank.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        rank: every unit's rank.
        micro: every unit's micro-batch.
        row: every unit's row.
        cells: ``float64`` ``(ranks, micro-batches)`` every cell's cost.
        budget: the most candidate units looked at.

    Example::

        >>> costs = np.array([6.0, 4.0, 3.0, 2.0, 1.0])
        >>> rank, micro = np.array([0, 1, 0, 0, 1]), np.array([1, 0, 0, 0, 1])
        >>> cells = np.array([[5.0, 6.0], [4.0, 1.0]])
        >>> free, slots = np.full((2, 2, 1), 10), np.full((2, 2, 1), 10)
        >>> relieve_columns(np.ones(5, np.int64), costs, np.ones(5, np.int64), np.arange(5),
        ...                 np.ones(2), free, slots, rank, micro, np.zeros(5, np.int64), cells,
        ...                 100)
        2
        >>> cells.tolist()  # the step: 5 + 6 before, 3 + 6 after
        [[3.0, 6.0], [3.0, 4.0]]
    """
    w, num_micro = cells.shape
    n = lengths.shape[0]
    if w < 2 or num_micro < 2 or n == 0:
        return 0
    # Every cell's units, contiguous (a trade keeps the counts): cell (r, k) holds
    # units[start[r, k] : start[r, k] + count[r, k]], in ascending unit order at first.
    count = np.zeros((w, num_micro), np.int64)
    for i in range(n):
        count[rank[i], micro[i]] += 1
    start = np.zeros((w, num_micro), np.int64)
    total = 0
    for r in range(w):
        for k in range(num_micro):
            start[r, k] = total
            total += count[r, k]
    units = np.empty(n, np.int64)
    where = np.empty(n, np.int64)
    filled = start.copy()
    for i in range(n):
        where[i] = filled[rank[i], micro[i]]
        units[where[i]] = i
        filled[rank[i], micro[i]] += 1
    pos = np.empty(n, np.int64)
    for t in range(n):
        pos[order[t]] = t
    level, classes, size = speed_classes(speeds)
    g_count = size.shape[0]
    ladder = np.empty((num_micro, g_count, classes.shape[1]), np.int64)
    for k in range(num_micro):
        for g in range(g_count):
            mine = classes[g, : size[g]]
            ladder[k, g, : size[g]] = mine[np.argsort(cells[mine, k], kind="mergesort")]
    top = np.empty(num_micro)
    for k in range(num_micro):
        top[k] = _slowest(cells[:, k], ladder[k], size, speeds)[1]
    # The most cost a cell can take below its maximum; trades only lower it.
    reach = 0.0
    for k in range(num_micro):
        for r in range(w):
            reach = max(reach, top[k] * speeds[r] - cells[r, k])
    trades = looks = 0
    changed = True
    while changed and looks < budget:
        changed = False
        for k in range(num_micro):
            a, high, second = _slowest(cells[:, k], ladder[k], size, speeds)
            best_i, best_j = -1, -1
            b_gain, b_slack, b_time, b_k, b_r = -1.0, np.inf, np.inf, -1, -1
            for x in range(start[a, k], start[a, k] + count[a, k]):
                i = units[x]
                qa = row[i]
                for t in range(pos[i] + 1, min(n, pos[i] + 1 + _SCAN)):
                    j = order[t]
                    d = costs[i] - costs[j]
                    if d > reach:
                        break
                    looks += 1
                    kk, b, qb = micro[j], rank[j], row[j]
                    if d <= 0.0 or kk == k:
                        continue
                    time = (cells[b, kk] + d) / speeds[b]
                    gain = high - max(second, (cells[a, k] - d) / speeds[a])
                    if time > top[kk] or (gain == 0.0 and time >= top[kk]) or gain < b_gain:
                        continue
                    if (
                        lengths[j] > free[a, k, qa] + lengths[i]
                        or lengths[i] > free[b, kk, qb] + lengths[j]
                        or docs[j] > slots[a, k, qa] + docs[i]
                        or docs[i] > slots[b, kk, qb] + docs[j]
                    ):
                        continue
                    if cell_before(-gain, top[kk] - time, time, kk, b,
                                   -b_gain, b_slack, b_time, b_k, b_r):  # fmt: skip
                        best_i, best_j = i, j
                        b_gain, b_slack, b_time, b_k, b_r = gain, top[kk] - time, time, kk, b
            if best_i < 0:
                continue
            i, j, kk, b = best_i, best_j, b_k, b_r
            qa, qb = row[i], row[j]
            d = costs[i] - costs[j]
            x = rung(cells[:, k], ladder[k, level[a]], size[level[a]], a)
            cells[a, k] -= d
            sink(cells[:, k], ladder[k, level[a]], x, a)
            x = rung(cells[:, kk], ladder[kk, level[b]], size[level[b]], b)
            cells[b, kk] += d
            climb(cells[:, kk], ladder[kk, level[b]], size[level[b]], x, b)
            free[a, k, qa] += lengths[i] - lengths[j]
            free[b, kk, qb] += lengths[j] - lengths[i]
            slots[a, k, qa] += docs[i] - docs[j]
            slots[b, kk, qb] += docs[j] - docs[i]
            units[where[i]], units[where[j]] = j, i
            where[i], where[j] = where[j], where[i]
            rank[i], micro[i], row[i], rank[j], micro[j], row[j] = b, kk, qb, a, k, qa
            top[k] = _slowest(cells[:, k], ladder[k], size, speeds)[1]
            top[kk] = _slowest(cells[:, kk], ladder[kk], size, speeds)[1]
            trades += 1
            changed = True
    return trades


@njit(cache=True)
def _slowest(
    cells: np.ndarray, ladders: np.ndarray, size: np.ndarray, speeds: np.ndarray
) -> tuple[int, float, float]:
    # One micro-batch's slowest cell from its classes' top rungs: (rank, its time, the
    # next time among the other cells; -inf with none).
    a, high, second = -1, -np.inf, -np.inf
    for g in range(size.shape[0]):
        r = ladders[g, size[g] - 1]
        time = cells[r] / speeds[r]
        if time > high:
            second = max(second, high)
            a, high = r, time
        else:
            second = max(second, time)
        if size[g] > 1:
            other = ladders[g, size[g] - 2]
            second = max(second, cells[other] / speeds[other])
    return a, high, second
