"""The long-first construction of ``balance="micro"``: long units first, each micro-batch of
them filled up to its costliest cell.

A unit longer than half the token cap (``2 · length > cap``, "long") shares no cell with
another long unit, so a step with ``L`` of them has at least ``q = ceil(L / ranks)``
micro-batches whose maximum is a long unit. The greedy spreads the long units over many
micro-batches and leaves gaps the short units cannot close under the cap; here they are
dealt out costliest first, ``ranks`` to a micro-batch, into the first ``q`` micro-batches
(rank ``r`` of micro-batch ``j`` takes the ``r``-th of its group), so every long unit sits
among long units of similar cost. Then each of those micro-batches' other cells is filled
toward its costliest cell: the short units, costliest first, each to the cheapest cell
where it stays within that cost and the cell's rows; the costliest cell itself takes
nothing. The units left are planned by the kernel's other constructions into the other
micro-batches (``chronica.core.packing.lockstep``), and the whole replaces the plan where its
lockstep step is shorter. A pure-Python twin is in ``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import fit_row, place_unit

__all__ = ["fill_long", "long_micro_batches"]


@njit(cache=True)
def long_micro_batches(lengths: np.ndarray, cap: int, w: int) -> int:
    """The micro-batches the long units (``2 · length > cap``) fill, ``w`` to each.

    Args:
        lengths: ``int64`` tokens per unit.
        cap: tokens per micro-batch (``rows · row_length``).
        w: the ranks.

    Example::

        >>> long_micro_batches(np.array([9, 9, 9, 3]), 16, 2)
        2
    """
    count = 0
    for i in range(lengths.shape[0]):
        count += 2 * lengths[i] > cap
    return -(-count // w)


@njit(cache=True)
def fill_long(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    cap: int,
    q: int,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
    used: np.ndarray,
) -> bool:
    """Micro-batches ``0 .. q - 1`` of the module docstring: the long units by ``order``, the
    ``t``-th to rank ``t % w`` of micro-batch ``t // w``; then, in each, the short units by
    ``order`` each to the cheapest cell (ties: the lower rank) below the micro-batch's
    costliest whose cost stays at most that one's and which has a row for it. ``False`` if a
    long unit fits no row of its empty cell (the outputs are then partial).

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit (they count against the rows' slots).
        order: the units by descending cost (``chronica.core.kernels.argsort_descending``).
        cap: tokens per micro-batch; a unit is long where ``2 · length > cap``.
        q: micro-batches to fill, ``long_micro_batches(lengths, cap, w)``.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens, updated.
        slots: ``int64`` same shape, documents every row can still take, updated.
        rank: ``int64`` output, the placed units' rank.
        micro: ``int64`` output, the placed units' micro-batch.
        row: ``int64`` output, the placed units' row.
        cells: ``float64`` ``(ranks, micro-batches)`` every cell's cost, updated.
        used: ``bool`` per unit, set for the units placed.

    Example::

        >>> rank, micro, row = (np.full(4, -1, np.int64) for _ in range(3))
        >>> cells, used = np.zeros((2, 2)), np.zeros(4, np.bool_)
        >>> fill_long(np.array([9, 9, 4, 2]), np.array([81.0, 70.0, 16.0, 4.0]),
        ...           np.ones(4, np.int64), np.arange(4), 16, 1,
        ...           np.full((2, 2, 1), 16, np.int64), np.full((2, 2, 1), 4, np.int64),
        ...           rank, micro, row, cells, used)
        True
        >>> rank.tolist(), micro.tolist(), cells[:, 0].tolist()
        ([0, 1, -1, 1], [0, 0, -1, 0], [81.0, 74.0])
    """
    w = cells.shape[0]
    t = 0
    for i in order:
        if 2 * lengths[i] <= cap:
            continue
        r, k = t % w, t // w
        x = fit_row(free[r, k], slots[r, k], lengths[i], docs[i])
        if x < 0:
            return False
        place_unit(lengths, costs, docs, i, r, k, x, free, slots, rank, micro, row, cells)
        used[i] = True
        t += 1
    for k in range(q):
        target = cells[:, k].max()
        low, room = _open(free, slots, cells, k, target)
        # Cells only fill up: a unit no cell took, and any unit no cheaper, shorter or of
        # fewer documents, fits none later either.
        miss_cost, miss_length, miss_docs = np.inf, 0, 0
        for i in order:
            if used[i] or low + costs[i] > target or room < lengths[i]:
                continue
            if costs[i] >= miss_cost and lengths[i] >= miss_length and docs[i] >= miss_docs:
                continue
            best, best_row = -1, -1
            for r in range(w):
                if cells[r, k] + costs[i] > target or cells[r, k] >= target:
                    continue
                if best >= 0 and cells[r, k] >= cells[best, k]:
                    continue
                x = fit_row(free[r, k], slots[r, k], lengths[i], docs[i])
                if x >= 0:
                    best, best_row = r, x
            if best < 0:
                miss_cost, miss_length, miss_docs = costs[i], lengths[i], docs[i]
                continue
            place_unit(lengths, costs, docs, i, best, k, best_row, free, slots, rank, micro,
                       row, cells)  # fmt: skip
            used[i] = True
            low, room = _open(free, slots, cells, k, target)
    return True


@njit(cache=True)
def _open(
    free: np.ndarray, slots: np.ndarray, cells: np.ndarray, k: int, target: float
) -> tuple[float, int]:
    # Micro-batch ``k``'s cells below ``target``: the cheapest one's cost and the largest
    # room of any (a unit that exceeds either fits none of them, and is skipped unscanned).
    low, room = np.inf, -1
    for r in range(cells.shape[0]):
        if cells[r, k] < target:
            low = min(low, cells[r, k])
            for x in range(free.shape[2]):
                if slots[r, k, x] > 0:
                    room = max(room, free[r, k, x])
    return low, room
