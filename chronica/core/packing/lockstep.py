"""The numba kernels of ``balance="micro"``: documents to (rank, micro-batch) cells so that
the lockstep step, ``sum_k max_r C[r, k] / speed[r]``, is as short as the kernel finds.

Under FSDP, ZeRO-3 and expert parallelism every micro-batch ends in a collective, so
micro-batch *k* of every rank runs in lockstep and the step lasts the sum over *k* of the
slowest rank's micro-batch *k*. The kernels place documents on a grid of cells (one per
rank and micro-batch), each cell holding ``rows`` rows of ``row_length`` tokens:

documents in descending cost order, each to the cell whose micro-batch maximum rises least
when it takes the document; among cells where it does not rise, the one left with the least
slack below that maximum (best fit, so that large gaps stay for large documents); ties by the
lower time, then the lower cell (micro-batch, then rank). While as many documents are left as
cells are empty, a document goes to an empty cell, so no cell is empty where the step has at
least as many documents as cells. (A refinement by moves and trades was measured: it bought
less than 0.1% of the lockstep figure for 10-50x the planning time.)

Documents that fit no row make the attempt fail (``False``); ``pack_step`` then retries with
more micro-batches. The result depends on the inputs only (deterministic on every machine).
Pure-Python twins are in ``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import fit_row

__all__ = ["lockstep_attempt", "step_maxima"]


@njit(cache=True)
def step_maxima(times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every micro-batch (column of ``times``): its largest cell time, the rank holding
    it (the lowest on ties) and the second largest time (the largest of the other ranks).

    Args:
        times: ``float64`` ``(ranks, micro-batches)``, every cell's cost over its speed.

    Example::

        >>> top, who, second = step_maxima(np.array([[3.0, 1.0], [2.0, 4.0]]))
        >>> top.tolist(), who.tolist(), second.tolist()
        ([3.0, 4.0], [0, 1], [2.0, 1.0])
    """
    w, m = times.shape
    top = np.full(m, -np.inf)
    second = np.full(m, -np.inf)
    who = np.zeros(m, np.int64)
    for k in range(m):
        for r in range(w):
            t = times[r, k]
            if t > top[k]:
                second[k] = top[k]
                top[k], who[k] = t, r
            elif t > second[k]:
                second[k] = t
        if w == 1:
            second[k] = 0.0
    return top, who, second


@njit(cache=True)
def lockstep_attempt(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    num_micro: int,
    rows: int,
    row_length: int,
    row_docs: int,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
) -> bool:
    """Place one step's units (documents, or groups kept whole) on ``speeds.shape[0]`` ranks
    times ``num_micro`` micro-batches: the greedy of the module docstring, then
    ``lockstep_refine``. ``False`` if a unit fits nowhere (the outputs are then partial).

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` predicted cost per unit.
        docs: ``int64`` documents per unit (they count against ``row_docs``).
        order: the units by descending cost (``chronica.core.kernels.argsort_descending``).
        speeds: ``float64`` relative speed per rank (``> 0``).
        num_micro: micro-batches per rank.
        rows: rows per micro-batch.
        row_length: tokens per row.
        row_docs: the most documents in one row.
        rank: ``int64`` output, every unit's rank.
        micro: ``int64`` output, every unit's micro-batch.
        row: ``int64`` output, every unit's row.
        cells: ``float64`` output ``(ranks, num_micro)``, every cell's cost.

    Example::

        >>> rank, micro, row = (np.empty(4, np.int64) for _ in range(3))
        >>> cells = np.empty((2, 2))
        >>> lockstep_attempt(np.array([4, 3, 2, 1]), np.array([4.0, 3.0, 2.0, 1.0]),
        ...                  np.ones(4, np.int64), np.arange(4), np.ones(2), 2, 1, 8, 8,
        ...                  rank, micro, row, cells)
        True
        >>> cells.tolist()
        [[4.0, 2.0], [3.0, 1.0]]
    """
    w = speeds.shape[0]
    n = lengths.shape[0]
    free = np.full((w, num_micro, rows), row_length, np.int64)
    slots = np.full((w, num_micro, rows), row_docs, np.int64)
    count = np.zeros((w, num_micro), np.int64)
    cells[:, :] = 0.0
    top = np.zeros(num_micro)
    empty = w * num_micro
    for t in range(n):
        i = order[t]
        forced = empty > 0 and n - t <= empty
        best_r, best_k, best_row = -1, -1, -1
        best_rise, best_slack, best_time = np.inf, np.inf, np.inf
        for k in range(num_micro):
            for r in range(w):
                if forced and count[r, k] > 0:
                    continue
                q = fit_row(free[r, k], slots[r, k], lengths[i], docs[i])
                if q < 0:
                    continue
                time = (cells[r, k] + costs[i]) / speeds[r]
                rise = max(0.0, time - top[k])
                slack = top[k] - time if rise == 0.0 else 0.0
                if rise < best_rise or (
                    rise == best_rise
                    and (slack < best_slack or (slack == best_slack and time < best_time))
                ):
                    best_r, best_k, best_row = r, k, q
                    best_rise, best_slack, best_time = rise, slack, time
        if best_r < 0:
            return False
        rank[i], micro[i], row[i] = best_r, best_k, best_row
        free[best_r, best_k, best_row] -= lengths[i]
        slots[best_r, best_k, best_row] -= docs[i]
        if count[best_r, best_k] == 0:
            empty -= 1
        count[best_r, best_k] += 1
        cells[best_r, best_k] += costs[i]
        top[best_k] = max(top[best_k], best_time)
    return True
