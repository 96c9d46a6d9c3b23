"""The lockstep greedy's choice of a cell for one unit (``chronica.core.packing.lockstep``):
the fullest cell it fits under its micro-batch's maximum, found on the micro-batch's ladders
(``chronica.core.packing.ladder``), or, while as many units are left as cells are empty,
the best empty cell; the same order of cells (``cell_before``) either way.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import fit_row
from chronica.core.packing.ladder import cell_before

__all__ = ["best_cell", "best_empty_cell"]


@njit(cache=True)
def best_cell(
    length: int,
    cost: float,
    docs: int,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    room: np.ndarray,
    cells: np.ndarray,
    top: np.ndarray,
    ladder: np.ndarray,
    size: np.ndarray,
    level: np.ndarray,
    room_top: np.ndarray,
) -> tuple[int, int, int, float]:
    """The greedy's cell for one unit: per micro-batch and speed class, the fullest cell it
    fits under the micro-batch's maximum (bisection, then down past cells without room);
    where there is none anywhere, the emptiest cell with room. Micro-batches whose largest
    room (``room_top``) is too small are skipped. ``(rank, micro-batch, row, time)``, rank
    -1 where no cell has room.

    Args:
        length: the unit's tokens.
        cost: its predicted cost.
        docs: its documents.
        speeds: ``float64`` relative speed per rank.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens.
        slots: ``int64`` same shape, documents every row can still take.
        room: ``int64`` ``(ranks, micro-batches)`` largest free row of every cell.
        cells: ``float64`` ``(ranks, micro-batches)`` cost per cell.
        top: ``float64`` every micro-batch's maximum time.
        ladder: ``int64`` ``(micro-batches, classes, ranks)`` the ladders
            (``chronica.core.packing.ladder``).
        size: ``int64`` every speed class's ranks.
        level: ``int64`` every rank's speed class.
        room_top: ``int64`` every micro-batch's largest room.
    """
    num_micro, classes = ladder.shape[0], ladder.shape[1]
    best_r, best_k, best_q = -1, -1, -1
    b_rise, b_slack, b_time = np.inf, np.inf, np.inf
    for k in range(num_micro):
        if room_top[k] < length:
            continue
        for g in range(classes):
            speed = speeds[ladder[k, g, 0]]
            lo, hi = 0, size[g]
            while lo < hi:
                mid = (lo + hi) // 2
                if (cells[ladder[k, g, mid], k] + cost) / speed <= top[k]:
                    lo = mid + 1
                else:
                    hi = mid
            x = lo - 1
            while x >= 0:
                # The block of costs equal to rung ``x``'s (bisected), lowest rank first.
                value = cells[ladder[k, g, x], k]
                lo, hi = 0, x
                if x == 0 or cells[ladder[k, g, x - 1], k] < value:
                    lo = hi = x  # a block of one, the common case
                while lo < hi:
                    mid = (lo + hi) // 2
                    if cells[ladder[k, g, mid], k] < value:
                        lo = mid + 1
                    else:
                        hi = mid
                q = -1
                for y in range(lo, x + 1):
                    r = ladder[k, g, y]
                    if room[r, k] >= length:
                        q = fit_row(free[r, k], slots[r, k], length, docs)
                        if q >= 0:
                            break
                if q >= 0:
                    time = (value + cost) / speed
                    if cell_before(0.0, top[k] - time, time, k, r,
                               b_rise, b_slack, b_time, best_k, best_r):  # fmt: skip
                        best_r, best_k, best_q = r, k, q
                        b_rise, b_slack, b_time = 0.0, top[k] - time, time
                    break
                x = lo - 1
    if best_r >= 0:
        return best_r, best_k, best_q, b_time
    for k in range(num_micro):
        if room_top[k] < length:
            continue
        for g in range(classes):
            for y in range(size[g]):
                r = ladder[k, g, y]
                if room[r, k] < length:
                    continue
                q = fit_row(free[r, k], slots[r, k], length, docs)
                if q >= 0:
                    time = (cells[r, k] + cost) / speeds[r]
                    rise = time - top[k]
                    if cell_before(rise, 0.0, time, k, r, b_rise, b_slack, b_time, best_k, best_r):
                        best_r, best_k, best_q = r, k, q
                        b_rise, b_slack, b_time = rise, 0.0, time
                    break
    return best_r, best_k, best_q, b_time


@njit(cache=True)
def best_empty_cell(
    length: int,
    cost: float,
    docs: int,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    count: np.ndarray,
    cells: np.ndarray,
    top: np.ndarray,
) -> tuple[int, int, int, float]:
    """``best_cell`` among the empty cells only (as many units left as empty cells):
    ``(rank, micro-batch, row, time)``, rank -1 where none has room.

    Args:
        length: the unit's tokens.
        cost: its predicted cost.
        docs: its documents.
        speeds: ``float64`` relative speed per rank.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens.
        slots: ``int64`` same shape, documents every row can still take.
        count: ``int64`` ``(ranks, micro-batches)`` units per cell.
        cells: ``float64`` ``(ranks, micro-batches)`` cost per cell.
        top: ``float64`` every micro-batch's maximum time.
    """
    w, num_micro = count.shape
    best_r, best_k, best_q = -1, -1, -1
    b_rise, b_slack, b_time = np.inf, np.inf, np.inf
    for k in range(num_micro):
        for r in range(w):
            if count[r, k] > 0:
                continue
            q = fit_row(free[r, k], slots[r, k], length, docs)
            if q < 0:
                continue
            time = (cells[r, k] + cost) / speeds[r]
            rise = max(0.0, time - top[k])
            slack = top[k] - time if rise == 0.0 else 0.0
            if cell_before(rise, slack, time, k, r, b_rise, b_slack, b_time, best_k, best_r):
                best_r, best_k, best_q = r, k, q
                b_rise, b_slack, b_time = rise, slack, time
    return best_r, best_k, best_q, b_time
