"""The trade search of the rank refinement (``chronica.core.packing.kernels.refine``): a
document of the slowest rank for one cheaper document, or two of one row, of a partner rank,
each side taking the other's row slot, so that the larger of the two ranks' times falls
most (``best_trade``, ``trade_among``), and the candidates such a search counts against the
refinement's work bound (``trade_work``).

A one-for-one search evaluates only the partner documents whose cost lies in the window
that can gain (each partner's documents sorted by cost, bisected), with the choice of a scan
of every candidate: the first document of the slowest rank (ascending) reaching the largest
gain, with its first partner (ascending) among equals. Pure-Python twins are in
``tests/helpers/reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["best_trade", "trade_among", "trade_work"]

# Relative widening of the one-for-one search's cost window over float rounding.
_WINDOW_MARGIN = 1e-12


@njit(cache=True)
def best_trade(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
    a: int,
    partner: np.ndarray,
    pairs: bool,
    gain: float,
) -> tuple[int, int, int]:
    """The trade of a document ``i`` of rank ``a`` for document ``j`` (and, with
    ``pairs``, maybe ``k`` of the same row; else -1) of a ``partner`` rank that lowers the
    larger of the two ranks' times most, by more than ``gain``: ``(i, j, k)``, ``i = -1``
    if none. ``i`` takes the row slot of ``j`` (and ``k``); they take the slot of ``i``.

    Args:
        lengths: ``int64`` tokens per document.
        costs: ``float64`` predicted cost per document.
        docs: ``int64`` documents per unit.
        speeds: ``float64`` relative speed per rank.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        rank: every document's rank.
        micro: every document's micro-batch.
        row: every document's row.
        loads: every rank's total cost.
        a: the rank giving a document (the slowest).
        partner: ``bool`` per rank, the ranks searched.
        pairs: also try one document for two of one row.
        gain: the least gain worth a trade.

    Example: ``refine`` searches this way (``trade_among``) when no single move helps;
    ``tests/helpers/reference.py`` holds its pure-Python twin.
    """
    n = lengths.shape[0]
    mine = np.empty(n, np.int64)
    theirs = np.empty(n, np.int64)
    num_mine = num_theirs = 0
    for i in range(n):
        if rank[i] == a:
            mine[num_mine] = i
            num_mine += 1
        elif partner[rank[i]]:
            theirs[num_theirs] = i
            num_theirs += 1
    return trade_among(
        lengths, costs, docs, speeds, free, slots, rank, micro, row, loads, a,
        mine[:num_mine], theirs[:num_theirs], pairs, gain,
    )  # fmt: skip


@njit(cache=True)
def trade_among(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
    a: int,
    mine: np.ndarray,
    theirs: np.ndarray,
    pairs: bool,
    gain: float,
) -> tuple[int, int, int]:
    """``best_trade`` given the documents searched: ``mine``, those of rank ``a``, and
    ``theirs``, those of the partner ranks, each in ascending order.

    Args:
        lengths: ``int64`` tokens per document.
        costs: ``float64`` predicted cost per document.
        docs: ``int64`` documents per unit.
        speeds: ``float64`` relative speed per rank.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        rank: every document's rank.
        micro: every document's micro-batch.
        row: every document's row.
        loads: every rank's total cost.
        a: the rank giving a document (the slowest).
        mine: ``int64`` the documents of ``a``, ascending.
        theirs: ``int64`` the documents of the partner ranks, ascending.
        pairs: also try one document for two of one row.
        gain: the least gain worth a trade.

    Example: ``best_trade`` and ``refine`` call it.
    """
    if not pairs:
        return _best_single_trade(
            lengths, costs, docs, speeds, free, slots, rank, micro, row, loads, a, mine, theirs,
            gain,
        )  # fmt: skip
    top = loads[a] / speeds[a]
    num_theirs = theirs.shape[0]
    m, r = free.shape[1], free.shape[2]
    # Their documents row by row, so that the pairs of one row are neighbours.
    keys = (rank[theirs] * m + micro[theirs]) * r + row[theirs]
    by_row = np.argsort(keys, kind="mergesort")
    grouped, keys = theirs[by_row], keys[by_row]
    best_i, best_j, best_k = -1, -1, -1
    for i in mine:
        slot_a = free[a, micro[i], row[i]] + lengths[i]
        docs_a = slots[a, micro[i], row[i]] + docs[i]
        start = 0
        while start < num_theirs:
            stop = start + 1
            while stop < num_theirs and keys[stop] == keys[start]:
                stop += 1
            first = grouped[start]
            b = rank[first]
            slot_b = free[b, micro[first], row[first]]
            docs_b = slots[b, micro[first], row[first]]
            for x in range(start, stop):
                j = grouped[x]
                # y == x: j alone; y > x: j with a later document of its row.
                for y in range(x, stop):
                    k = -1 if y == x else grouped[y]
                    taken = lengths[j] + (lengths[k] if k >= 0 else 0)
                    given = costs[j] + (costs[k] if k >= 0 else 0.0)
                    if given >= costs[i] or taken > slot_a or lengths[i] > slot_b + taken:
                        continue
                    counted = docs[j] + (docs[k] if k >= 0 else 0)
                    if counted > docs_a or docs[i] > docs_b + counted:
                        continue
                    d = costs[i] - given
                    new_top = max((loads[a] - d) / speeds[a], (loads[b] + d) / speeds[b])
                    if top - new_top > gain:
                        gain, best_i, best_j, best_k = top - new_top, i, j, k
            start = stop
    return best_i, best_j, best_k


@njit(cache=True)
def _best_single_trade(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    speeds: np.ndarray,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
    a: int,
    mine: np.ndarray,
    theirs: np.ndarray,
    gain: float,
) -> tuple[int, int, int]:
    # ``trade_among`` without pairs. A trade of ``i`` for ``j`` of rank ``b`` gains more than
    # ``gain`` only if ``d = costs[i] - costs[j]`` lowers ``a`` below ``top - gain`` without
    # lifting ``b`` above it: a window of ``costs[j]``, found by bisection in each partner's
    # documents sorted by cost (widened for rounding); only the window is evaluated. The
    # result is the scan's: the first ``i`` (ascending) reaching the largest gain, with its
    # first ``j`` (ascending) among equals.
    top = loads[a] / speeds[a]
    # Their documents by rank, then cost (ties ascending), with each rank's run.
    by_cost = theirs[np.argsort(costs[theirs], kind="mergesort")]
    grouped = by_cost[np.argsort(rank[by_cost], kind="mergesort")]
    size = grouped.shape[0]
    sorted_costs = costs[grouped]
    best_i, best_j = -1, -1
    for i in mine:
        slot_a = free[a, micro[i], row[i]] + lengths[i]
        docs_a = slots[a, micro[i], row[i]] + docs[i]
        level = top - gain
        margin = _WINDOW_MARGIN * (abs(level) * (speeds[a] + speeds.max()) + costs[i] + loads[a])
        # d > loads[a] - level·speeds[a]; per rank, d < level·speeds[b] - loads[b].
        high = costs[i] - (loads[a] - level * speeds[a]) + margin
        local, local_j = gain, -1
        run = 0
        while run < size:
            b = rank[grouped[run]]
            stop = run + 1
            while stop < size and rank[grouped[stop]] == b:
                stop += 1
            low = costs[i] - (level * speeds[b] - loads[b]) - margin
            x = run + np.searchsorted(sorted_costs[run:stop], low)
            while x < stop and sorted_costs[x] <= high:
                j = grouped[x]
                x += 1
                if costs[j] >= costs[i] or lengths[j] > slot_a:
                    continue
                if lengths[i] > free[b, micro[j], row[j]] + lengths[j]:
                    continue
                if docs[j] > docs_a or docs[i] > slots[b, micro[j], row[j]] + docs[j]:
                    continue
                d = costs[i] - costs[j]
                value = top - max((loads[a] - d) / speeds[a], (loads[b] + d) / speeds[b])
                if value > local or (value == local and local_j >= 0 and j < local_j):
                    local, local_j = value, j
            run = stop
        if local_j >= 0:
            gain, best_i, best_j = local, i, local_j
    return best_i, best_j, -1


@njit(cache=True)
def trade_work(
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    partner: np.ndarray,
    num_mine: int,
    cells: np.ndarray,
    shape: tuple[int, int, int],
    pairs: bool,
) -> int:
    """The candidates ``best_trade`` looks at (the refinement's work bound counts them):
    ``num_mine`` times the documents of ``partner`` ranks, or with ``pairs``, times the
    single documents and the pairs of one row, ``c·(c+1)/2`` for a row of ``c`` of them.

    Args:
        rank: every document's rank.
        micro: every document's micro-batch.
        row: every document's row.
        partner: ``bool`` per rank, the ranks searched.
        num_mine: the documents of the rank giving one.
        cells: ``int64`` zeros, one per row of every rank (``ranks · micro-batches · rows``);
            left zero.
        shape: ``(ranks, micro-batches, rows)``.
        pairs: count the pairs of one row too.

    Example::

        >>> trade_work(np.array([0, 1, 1]), np.zeros(3, np.int64), np.zeros(3, np.int64),
        ...            np.array([False, True]), 2, np.zeros(2, np.int64), (2, 1, 1), True)
        6
    """
    m, r = shape[1], shape[2]
    total = 0
    for i in range(rank.shape[0]):
        if partner[rank[i]]:
            if pairs:
                cell = (rank[i] * m + micro[i]) * r + row[i]
                cells[cell] += 1
                total += cells[cell]  # the c-th document of a row adds c candidates
            else:
                total += 1
    if pairs:
        for i in range(rank.shape[0]):
            if partner[rank[i]]:
                cells[(rank[i] * m + micro[i]) * r + row[i]] = 0
    return num_mine * total
