"""The leveling pass of ``balance="micro"``: after a construction of the lockstep kernel
(``chronica.core.packing.lockstep``), every micro-batch is leveled across the ranks by moves
and trades between its slowest cell and its fastest ones. ``level_steps`` is the pass; a
pure-Python twin is in ``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import fit_row

__all__ = ["level_steps"]

# Cells a slowest cell looks for a partner among, fastest first, when the fastest has no room.
_PARTNERS = 8


@njit(cache=True)
def level_steps(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
) -> None:
    """Level every micro-batch across the ranks: while a unit of its slowest cell (the first
    of equals) can move to its fastest cell (the first of equals), or trade places with a
    cheaper unit there, so that both cells end below the slowest's old time, make the change
    that leaves the larger of the two lowest (first found among equals; moves before trades,
    the slow cell's units in its list order, then the fast cell's). A move never empties a
    cell; a trade keeps each unit's row slot. At most ``ranks`` changes per micro-batch.
    Every array is updated in place.

    Each cell's units are a list in greedy order; a unit leaving it is replaced by the list's
    last one, a unit joining it is appended (``tests/helpers/lockstep_reference.py`` keeps the
    same lists).

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit.
        speeds: ``float64`` relative speed per rank.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        rank: every unit's rank.
        micro: every unit's micro-batch.
        row: every unit's row.
        cells: ``float64`` ``(ranks, micro-batches)`` every cell's cost.

    Example: ``lockstep_attempt`` ends with it.
    """
    w, num_micro = cells.shape
    n = lengths.shape[0]
    if w < 2 or n == 0:
        return
    count = np.zeros((w, num_micro), np.int64)
    for i in range(n):
        count[rank[i], micro[i]] += 1
    # A cell gains at most one unit per change, and a micro-batch takes at most ``w`` changes.
    members = np.empty((w, num_micro, count.max() + w), np.int64)
    filled = np.zeros((w, num_micro), np.int64)
    for i in range(n):
        r, k = rank[i], micro[i]
        members[r, k, filled[r, k]] = i
        filled[r, k] += 1
    where = np.empty(n, np.int64)  # every unit's place in its cell's list
    for r in range(w):
        for k in range(num_micro):
            for x in range(filled[r, k]):
                where[members[r, k, x]] = x
    times = np.empty(w)
    for k in range(num_micro):
        for _ in range(w):
            a = b = 0
            for r in range(w):
                times[r] = cells[r, k] / speeds[r]
                if times[r] > times[a]:
                    a = r
                if times[r] < times[b]:
                    b = r
            best_i, best_j = _best_change(
                lengths, costs, docs, speeds, free, slots, cells, members, filled, row, k, a, b
            )
            if best_i < 0:
                # The fastest cell has no room: the next fastest few, while faster than a.
                for b in np.argsort(times, kind="mergesort")[:_PARTNERS]:
                    if times[b] >= times[a]:
                        break
                    best_i, best_j = _best_change(
                        lengths, costs, docs, speeds, free, slots, cells, members, filled, row,
                        k, a, b,
                    )  # fmt: skip
                    if best_i >= 0:
                        break
            if best_i < 0:
                break
            i, j = best_i, best_j
            if j < 0:
                q = fit_row(free[b, k], slots[b, k], lengths[i], docs[i])
                free[a, k, row[i]] += lengths[i]
                slots[a, k, row[i]] += docs[i]
                free[b, k, q] -= lengths[i]
                slots[b, k, q] -= docs[i]
                cells[a, k] -= costs[i]
                cells[b, k] += costs[i]
                last = members[a, k, filled[a, k] - 1]
                members[a, k, where[i]] = last
                where[last] = where[i]
                filled[a, k] -= 1
                members[b, k, filled[b, k]] = i
                where[i] = filled[b, k]
                filled[b, k] += 1
                rank[i], row[i] = b, q
                continue
            qa, qb = row[i], row[j]
            free[a, k, qa] += lengths[i] - lengths[j]
            free[b, k, qb] += lengths[j] - lengths[i]
            slots[a, k, qa] += docs[i] - docs[j]
            slots[b, k, qb] += docs[j] - docs[i]
            d = costs[i] - costs[j]
            cells[a, k] -= d
            cells[b, k] += d
            members[a, k, where[i]], members[b, k, where[j]] = j, i
            where[i], where[j] = where[j], where[i]
            rank[i], row[i], rank[j], row[j] = b, qb, a, qa


@njit(cache=True)
def _best_change(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    cells: np.ndarray,
    members: np.ndarray,
    filled: np.ndarray,
    row: np.ndarray,
    k: int,
    a: int,
    b: int,
) -> tuple[int, int]:
    # The move of a unit ``i`` of cell (a, k) to (b, k), or its trade with a cheaper ``j``
    # there, leaving the larger of the two cells' times lowest and below a's: ``(i, j)``,
    # ``j = -1`` for a move, ``i = -1`` for none.
    best, best_i, best_j = cells[a, k] / speeds[a] * (1.0 - 1e-12), -1, -1
    for x in range(filled[a, k]):
        i = members[a, k, x]
        if filled[a, k] > 1 and fit_row(free[b, k], slots[b, k], lengths[i], docs[i]) >= 0:
            pair = max((cells[a, k] - costs[i]) / speeds[a], (cells[b, k] + costs[i]) / speeds[b])
            if pair < best:
                best, best_i, best_j = pair, i, -1
    for x in range(filled[a, k]):
        i = members[a, k, x]
        for y in range(filled[b, k]):
            j = members[b, k, y]
            if costs[j] >= costs[i]:
                continue
            if (
                lengths[j] > free[a, k, row[i]] + lengths[i]
                or lengths[i] > free[b, k, row[j]] + lengths[j]
            ):
                continue
            if docs[j] > slots[a, k, row[i]] + docs[i] or docs[i] > slots[b, k, row[j]] + docs[j]:
                continue
            d = costs[i] - costs[j]
            pair = max((cells[a, k] - d) / speeds[a], (cells[b, k] + d) / speeds[b])
            if pair < best:
                best, best_i, best_j = pair, i, j
    return best_i, best_j
