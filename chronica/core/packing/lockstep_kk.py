"""The fourth construction of ``balance="micro"``: largest differencing (Karmarkar–Karp),
which the lockstep kernel (``chronica.core.packing.lockstep``) tries beside its other
constructions, keeping whichever plan is shorter.

Where units are small against a micro-batch, the lockstep step is nearly the largest rank
sum: every rank cuts its share into micro-batches of nearly equal cost, and micro-batch *k*
of every rank is about ``1 / num_micro`` of its sum. Then what decides the step is how
close the rank sums are, and how even each rank's micro-batches are, and differencing gets
both closer than a greedy: each partial solution is a set of ``k`` groups, and the two
partial solutions of the largest spread (largest minus smallest sum) merge, the heaviest
group of one with the lightest of the other, until one is left.

1. The units, by ascending cost, in runs of ``ranks`` consecutive units (the cheapest run
   padded with empty places), one partial solution per run: every rank gets as many units
   as any other, give or take one; group *g* of the result (descending sum) is rank *g*.
2. Every rank's units into ``num_micro`` groups (each unit its own partial solution); the
   groups are the rank's micro-batches, each unit, by descending cost, in the fullest row
   of its micro-batch it fits (``fit_row``); a unit that fits no row there (the
   differencing counts costs, not tokens) goes, after the others, to the rank's cheapest
   micro-batch with a row it fits (ties: fewer units, then the lower index). Where units
   went so, all the rank's units are also put, by descending cost, each into its cheapest
   micro-batch with a row it fits, and that is kept where its costliest micro-batch is
   cheaper; where a unit fits no row of the rank, or a micro-batch is left empty although
   the rank has a unit for each, that is tried, and where a unit fits none that way either
   (the step's tokens nearly fill its cells), each unit goes to the fullest row it fits in
   any of the rank's micro-batches (the tightest packing). The units that fit no row of
   their rank even so, by descending cost, go last, each to the cheapest cell of any rank
   with a row it fits (ties: fewer units, then the lower rank).
3. Every rank's micro-batches by descending cost (ties: the lower index first), so that the
   micro-batches running in lockstep are alike; the lockstep passes then level them.

Ranks of unequal speed are not planned here (``False``). Ties everywhere are broken by the
order of the inputs, so the plan depends on the inputs only. A pure-Python twin is in
``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import heapq

import numpy as np
from numba import njit

from chronica.core.packing.kernels import fit_row, place_unit
from chronica.core.packing.lockstep_ranked import sort_micro_batches

__all__ = ["kk_cells"]

# Groups of a partial solution are sorted in place by insertion up to this many.
_INSERTION = 32
# How ``_fill`` puts a rank's units in rows.
_PARTS, _CHEAPEST, _TIGHT = 0, 1, 2


@njit(cache=True)
def kk_cells(
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
    ranks' speeds differ, a unit fits no row, or a cell is left empty although the step has
    a unit for each (the outputs are then partial).
    Every output array is overwritten.

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

        >>> free, slots = np.empty((2, 2, 1), np.int64), np.empty((2, 2, 1), np.int64)
        >>> rank, micro, row = (np.empty(6, np.int64) for _ in range(3))
        >>> cells = np.empty((2, 2))
        >>> costs = np.array([8.0, 7.0, 6.0, 5.0, 4.0, 2.0])
        >>> kk_cells(costs.astype(np.int64), costs, np.ones(6, np.int64), np.arange(6),
        ...          np.ones(2), 16, 4, free, slots, rank, micro, row, cells)
        True
        >>> cells.tolist()
        [[8.0, 8.0], [9.0, 7.0]]
    """
    w, num_micro = cells.shape
    n = lengths.shape[0]
    for r in range(w):
        if speeds[r] != speeds[0]:
            return False
    free[:] = row_length
    slots[:] = row_docs
    cells[:, :] = 0.0
    count = np.zeros((w, num_micro), np.int64)
    ascending = order[::-1].copy()
    _difference(costs, ascending, w, True, rank)
    # Every rank's units, by ascending cost.
    start = np.zeros(w + 1, np.int64)
    for i in range(n):
        start[rank[i] + 1] += 1
    for r in range(w):
        start[r + 1] += start[r]
    members = np.empty(n, np.int64)
    filled = start[:w].copy()
    for t in range(n):
        i = ascending[t]
        members[filled[rank[i]]] = i
        filled[rank[i]] += 1
    for r in range(w):
        mine = members[start[r] : start[r + 1]]
        _difference(costs, mine, num_micro, False, micro)
        late = _fill(
            lengths, costs, docs, mine, r, _PARTS, free, slots, rank, micro, row, cells, count
        )
        if late == 0:
            continue
        # Units placed late, or none fit: the cheapest fill too; after late units, the fill
        # whose costliest micro-batch is cheaper is kept (the parts' on ties).
        top = cells[r].max()
        kept = (free[r].copy(), slots[r].copy(), cells[r].copy(), count[r].copy())
        kept_micro, kept_row = micro[mine], row[mine]
        for how in (_CHEAPEST, _TIGHT):
            free[r] = row_length
            slots[r] = row_docs
            cells[r] = 0.0
            count[r] = 0
            done = _fill(
                lengths, costs, docs, mine, r, how, free, slots, rank, micro, row, cells, count
            ) >= 0  # fmt: skip
            if done or late > 0:
                break
        if late > 0 and (not done or cells[r].max() >= top):
            free[r], slots[r], cells[r], count[r] = kept
            micro[mine], row[mine] = kept_micro, kept_row
    # The units no row of their rank took, by descending cost, each to the cheapest cell of
    # any rank with a row it fits (ties: fewer units, then the lower rank).
    for t in range(n):
        i = order[t]
        if micro[i] >= 0:
            continue
        best_r, best_k, best_q = -1, -1, -1
        for r in range(w):
            k, q = _open_row(lengths[i], docs[i], r, False, free, slots, cells, count)
            if k >= 0 and (
                best_r < 0
                or cells[r, k] < cells[best_r, best_k]
                or (cells[r, k] == cells[best_r, best_k] and count[r, k] < count[best_r, best_k])
            ):
                best_r, best_k, best_q = r, k, q
        if best_r < 0:
            return False
        place_unit(lengths, costs, docs, i, best_r, best_k, best_q, free, slots, rank, micro,
                   row, cells)  # fmt: skip
        count[best_r, best_k] += 1
    if n >= w * num_micro and count.min() == 0:
        return False
    sort_micro_batches(lengths, costs, docs, row_length, row_docs, free, slots, rank, micro, row,
                       cells)  # fmt: skip
    return True


@njit(cache=True)
def _fill(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    mine: np.ndarray,
    r: int,
    how: int,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
    count: np.ndarray,
) -> int:
    # Rank r's units (``mine``, ascending cost), by descending cost, into a row: ``_PARTS``
    # of the micro-batch ``micro`` names (the fullest row it fits), units that fit none
    # there waiting for a second sweep, which puts them as ``_CHEAPEST`` does: into the
    # rank's cheapest micro-batch with a row they fit (``_open_row``); ``_TIGHT`` into the
    # fullest row of any. A unit that fits no row of the rank keeps ``micro = -1``. The
    # number of units the second sweep placed, or -1 where a unit has no row or (but with
    # ``_TIGHT``) a micro-batch is left empty although the rank has a unit for each.
    placed = late = 0
    for sweep in range(2 if how == _PARTS else 1):
        for t in range(mine.shape[0] - 1, -1, -1):
            i = mine[t]
            if how == _PARTS and sweep == 0:
                k = micro[i]
                q = fit_row(free[r, k], slots[r, k], lengths[i], docs[i])
            elif how == _PARTS and micro[i] >= 0:
                continue
            else:
                k, q = _open_row(lengths[i], docs[i], r, how == _TIGHT, free, slots, cells, count)
            if q < 0:
                micro[i] = -1
                continue
            place_unit(lengths, costs, docs, i, r, k, q, free, slots, rank, micro, row, cells)
            count[r, k] += 1
            placed += 1
            late += sweep
    if placed < mine.shape[0]:
        return -1
    if how == _TIGHT or mine.shape[0] < cells.shape[1] or count[r].min() > 0:
        return late
    return -1


@njit(cache=True)
def _open_row(
    length: int,
    docs: int,
    r: int,
    tight: bool,
    free: np.ndarray,
    slots: np.ndarray,
    cells: np.ndarray,
    count: np.ndarray,
) -> tuple[int, int]:
    # Rank r's cheapest micro-batch with a row the unit fits (ties: fewer units, then the
    # lower index) and its fullest such row, or with ``tight`` the fullest row of any (ties:
    # the lower micro-batch, then row): ``(micro-batch, row)``, ``(-1, -1)`` where none.
    k, q = -1, -1
    for c in range(cells.shape[1]):
        if (
            not tight
            and k >= 0
            and (
                cells[r, c] > cells[r, k]
                or (cells[r, c] == cells[r, k] and count[r, c] >= count[r, k])
            )
        ):
            continue
        at = fit_row(free[r, c], slots[r, c], length, docs)
        if at >= 0 and (not tight or k < 0 or free[r, c, at] < free[r, k, q]):
            k, q = c, at
    return k, q


@njit(cache=True)
def _difference(
    values: np.ndarray, items: np.ndarray, k: int, equal: bool, group: np.ndarray
) -> None:
    # Largest differencing of ``items`` (ascending by value) into ``k`` groups: with
    # ``equal``, one partial solution per run of ``k`` consecutive items (the first run
    # padded with empty places), else one per item. ``group[item]`` is written, group 0 the
    # heaviest. Partial solutions: heap keyed by (-spread, creation tag).
    n = items.shape[0]
    if n == 0:
        return
    pad = (-n) % k if equal else 0
    p = (n + pad) // k if equal else n
    sums = np.zeros((p, k))
    head = np.full((p, k), -1, np.int64)
    tail = np.full((p, k), -1, np.int64)
    link = np.full(n, -1, np.int64)  # the next position in a group's list
    for j in range(p):
        for g in range(k if equal else 1):
            t = j * k + g - pad if equal else j
            if t >= 0:
                sums[j, g] = values[items[t]]
                head[j, g] = tail[j, g] = t
        _sort_groups(sums[j], head[j], tail[j])
    heap = [(-(sums[j, 0] - sums[j, k - 1]), j, j) for j in range(p)]
    heapq.heapify(heap)
    tag = p
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        for g in range(k):
            h = k - 1 - g
            sums[a, g] += sums[b, h]
            if head[b, h] < 0:
                continue
            if head[a, g] < 0:
                head[a, g] = head[b, h]
            else:
                link[tail[a, g]] = head[b, h]
            tail[a, g] = tail[b, h]
        _sort_groups(sums[a], head[a], tail[a])
        heapq.heappush(heap, (-(sums[a, 0] - sums[a, k - 1]), tag, a))
        tag += 1
    last = heap[0][2]
    for g in range(k):
        t = head[last, g]
        while t >= 0:
            group[items[t]] = g
            t = link[t]


@njit(cache=True)
def _sort_groups(sums: np.ndarray, head: np.ndarray, tail: np.ndarray) -> None:
    # One partial solution's groups by descending sum (stable: ties keep their places);
    # in place by insertion where groups are few (no allocation per merge).
    k = sums.shape[0]
    if k > _INSERTION:
        by = np.argsort(-sums, kind="mergesort")
        sums[:] = sums[by]
        head[:] = head[by]
        tail[:] = tail[by]
        return
    for g in range(1, k):
        s, h, t = sums[g], head[g], tail[g]
        x = g
        while x > 0 and sums[x - 1] < s:
            sums[x], head[x], tail[x] = sums[x - 1], head[x - 1], tail[x - 1]
            x -= 1
        sums[x], head[x], tail[x] = s, h, t
