"""The third construction of ``balance="micro"``: the rank kernel's plan with every rank's
micro-batches in descending cost order, which the lockstep kernel
(``chronica.core.packing.lockstep``) tries beside its ladder greedy on small steps, keeping
whichever plan is shorter.

The rank kernel's placement (``chronica.core.packing.kernels.lpt_place``, even
micro-batches first, without its refinement: the lockstep passes refine instead) balances
the ranks' sums and leaves each rank's micro-batches of similar cost, below the cap; sorting
them makes micro-batch *k* of every rank its *k*-th costliest, so the micro-batches that run
in lockstep are alike, and the room the cap leaves lets the leveling even them out. Where
documents are short against the cap this beats the ladder greedy, which fills micro-batches
to the cap and then has no room to level them. A plan that leaves a cell empty although the
step has a unit for each is refused. A pure-Python twin is in
``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import lpt_place

__all__ = ["ranked_cells", "sort_micro_batches"]


@njit(cache=True)
def ranked_cells(
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
    """Place the units on the ``cells.shape`` grid (module docstring); ``False`` where the
    rank kernel finds a unit no row, or leaves a cell empty although the step has a unit for
    each (the outputs are then partial). Every output array is overwritten.

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

        >>> free, slots = np.empty((1, 2, 1), np.int64), np.empty((1, 2, 1), np.int64)
        >>> rank, micro, row = (np.empty(3, np.int64) for _ in range(3))
        >>> cells = np.empty((1, 2))
        >>> ranked_cells(np.array([2, 3, 1]), np.array([2.0, 3.0, 1.0]), np.ones(3, np.int64),
        ...              np.array([1, 0, 2]), np.ones(1), 4, 4, free, slots, rank, micro, row,
        ...              cells)
        True
        >>> cells.tolist()
        [[3.0, 3.0]]
    """
    w, num_micro = cells.shape
    n = lengths.shape[0]
    free[:] = row_length
    slots[:] = row_docs
    if not lpt_place(
        lengths, costs, docs, order, speeds, False, free, slots, np.zeros((w, num_micro)),
        np.full(w, row_length, np.int64), np.zeros(w), rank, micro, row,
    ):  # fmt: skip
        return False
    cells[:, :] = 0.0
    count = np.zeros((w, num_micro), np.int64)
    for i in range(n):
        cells[rank[i], micro[i]] += costs[i]
        count[rank[i], micro[i]] += 1
    if n >= w * num_micro and count.min() == 0:
        return False
    sort_micro_batches(lengths, costs, docs, row_length, row_docs, free, slots, rank, micro, row,
                       cells)  # fmt: skip
    return True


@njit(cache=True)
def sort_micro_batches(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    row_length: int,
    row_docs: int,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
) -> None:
    """Renumber every rank's micro-batches by descending cost (equal costs keep their
    order), so that each micro-batch index lines up the ranks' costliest, then their next,
    and rebuild ``free``, ``slots`` and ``cells`` for the new numbers (rows unchanged).

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit.
        row_length: tokens per row.
        row_docs: the most documents in one row.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        rank: every unit's rank.
        micro: every unit's micro-batch, renumbered in place.
        row: every unit's row.
        cells: ``float64`` ``(ranks, micro-batches)`` every cell's cost.

    Example: ``ranked_cells`` and ``kk_cells`` end with it.
    """
    w, num_micro = cells.shape
    n = lengths.shape[0]
    place = np.empty((w, num_micro), np.int64)
    for r in range(w):
        place[r, np.argsort(-cells[r], kind="mergesort")] = np.arange(num_micro)
    free[:] = row_length
    slots[:] = row_docs
    cells[:, :] = 0.0
    for i in range(n):
        micro[i] = place[rank[i], micro[i]]
        free[rank[i], micro[i], row[i]] -= lengths[i]
        slots[rank[i], micro[i], row[i]] -= docs[i]
        cells[rank[i], micro[i]] += costs[i]
