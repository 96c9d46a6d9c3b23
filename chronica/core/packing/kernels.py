"""The numba kernels of ``pack_step``: documents to ranks, micro-batches and rows.

1. LPT under capacities (``pack_attempt``): documents in descending cost order (ties by
   position), each to the rank whose predicted time after taking it is lowest among those
   with a row it fits in; within the rank, to the cheapest micro-batch with such a row, and
   there to the fullest row it fits in (best fit, ``fit_micro``).
2. Refinement (``refine``): while the slowest rank is more than 1e-7 above the mean time and
   can give a document to another rank, or trade one for a cheaper one, so that the larger
   of the two new times falls, make the best such move. Trades (``packing.trades``) are
   looked for among the four lightest ranks (one for one; while the slowest rank is more than 1e-5
   above the mean, also one for two of one row), then, as long, among every rank (one for
   one, steps of at most 16384 documents). Trades keep each document's row slot, so the cap
   holds throughout. The search visits only the slowest rank's documents (kept per rank in
   ascending order), skips a move whose lower bound gains too little, and evaluates a
   one-for-one trade only where the partner's cost lies in the window that can gain (each
   partner's documents sorted by cost, bisected): the same choices as a scan of every
   candidate, several times faster. The refinement's work is bounded (``work_budget``): it
   stops once it has looked at more than ``max(2**22, n · (1024 + 4·W))`` candidate moves and trades
   (``n`` documents, ``W`` ranks; ``trade_work`` counts a trade search), which ordinary
   steps stay below; steps whose cap leaves little room, where each of many expensive trades
   gains a little, are cut off there (a few milliseconds, or about 3 µs per document).

The result depends on the lengths, costs and speeds only (deterministic on every machine).
Pure-Python twins of every kernel are in ``tests/helpers/reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.trades import trade_among, trade_work

__all__ = [
    "fit_micro",
    "fit_row",
    "largest_room",
    "lpt_place",
    "pack_attempt",
    "place_unit",
    "refine",
    "work_budget",
]

# Trades that gain less than this fraction of the top time are not worth an iteration.
_REL_TOL = 1e-9
# Relative margin of the move search's lower bound over float rounding.
_ROUNDING = 1e-12
# Refinement stops once the slowest rank is this close to the mean time (relative).
_CLOSE_ENOUGH = 1e-7
# Ranks a trade partner is looked for among first (the lightest ones).
_PARTNERS = 4
# Steps up to this many documents search every rank for a trade when the lightest fail.
_WIDE_SEARCH_MAX = 16384
# Trades of two documents for one, and searches of every rank, only while the slowest rank
# is this far above the mean time (relative): below it their cost buys only rounding.
_WORTH_MORE = 1e-5
# The refinement's work bound (``work_budget``): candidate moves and trades looked at per
# document, plus per document and rank (every iteration scans the documents and the ranks,
# and a step needs about one iteration per rank), and at least the floor (a few
# milliseconds), which small steps whose cap leaves little room need.
_WORK_PER_DOCUMENT = 1024
_WORK_PER_RANK = 4
_WORK_FLOOR = 1 << 22


@njit(cache=True)
def fit_row(free: np.ndarray, slots: np.ndarray, length: int, docs: int) -> int:
    """The fullest row that ``length`` tokens and ``docs`` documents fit in, or -1 (ties:
    the lower row).

    Args:
        free: ``int64`` free tokens of every row of one micro-batch.
        slots: ``int64`` documents every row can still take.
        length: the tokens to place.
        docs: the documents they are.

    Example::

        >>> fit_row(np.array([5, 3, 8]), np.array([1, 1, 1]), 3, 1)
        1
    """
    best = -1
    for k in range(free.shape[0]):
        if free[k] >= length and slots[k] >= docs and (best < 0 or free[k] < free[best]):
            best = k
    return best


@njit(cache=True)
def place_unit(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    i: int,
    r: int,
    k: int,
    x: int,
    free: np.ndarray,
    slots: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
) -> None:
    """Unit ``i`` into row ``x`` of cell ``(r, k)``: its place in ``rank``, ``micro`` and
    ``row``, its tokens off ``free[r, k, x]``, its documents off ``slots[r, k, x]``, its
    cost onto ``cells[r, k]``.

    Args:
        lengths: ``int64`` tokens per unit.
        costs: ``float64`` cost per unit.
        docs: ``int64`` documents per unit.
        i: the unit.
        r: its rank.
        k: its micro-batch.
        x: its row.
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens, updated.
        slots: ``int64`` same shape, documents every row can still take, updated.
        rank: ``int64`` the units' ranks, updated.
        micro: ``int64`` the units' micro-batches, updated.
        row: ``int64`` the units' rows, updated.
        cells: ``float64`` ``(ranks, micro-batches)`` cost per cell, updated.
    """
    rank[i], micro[i], row[i] = r, k, x
    free[r, k, x] -= lengths[i]
    slots[r, k, x] -= docs[i]
    cells[r, k] += costs[i]


@njit(cache=True)
def fit_micro(
    free: np.ndarray,
    slots: np.ndarray,
    micro_loads: np.ndarray,
    length: int,
    docs: int,
    tight: bool,
) -> tuple[int, int]:
    """Where in one rank ``length`` tokens (``docs`` documents) go: the cheapest micro-batch
    with a row they fit in, and there the fullest such row; with ``tight``, the fullest row
    of any micro-batch (best fit). ``(-1, -1)`` if they fit nowhere.

    Args:
        free: ``int64`` ``(micro-batches, rows)``, free tokens of every row of the rank.
        slots: ``int64`` ``(micro-batches, rows)``, documents every row can still take.
        micro_loads: ``float64``, the cost of every micro-batch of the rank.
        length: the tokens to place.
        docs: the documents they are.
        tight: best fit over every micro-batch instead of the cheapest one.

    Example::

        >>> fit_micro(np.array([[4, 4], [1, 2]]), np.ones((2, 2), np.int64),
        ...           np.array([0.0, 5.0]), 2, 1, True)
        (1, 1)
    """
    best_m, best_k = -1, -1
    for m in range(free.shape[0]):
        if tight:
            k = fit_row(free[m], slots[m], length, docs)
            if k >= 0 and (best_m < 0 or free[m, k] < free[best_m, best_k]):
                best_m, best_k = m, k
            continue
        if best_m >= 0 and micro_loads[m] >= micro_loads[best_m]:
            continue
        k = fit_row(free[m], slots[m], length, docs)
        if k >= 0:
            best_m, best_k = m, k
    return best_m, best_k


@njit(cache=True)
def largest_room(free: np.ndarray, slots: np.ndarray) -> int:
    """The largest free space of any row of one rank that can still take a document (-1 if
    none can).

    Args:
        free: ``int64`` ``(micro-batches, rows)``, free tokens of every row of the rank.
        slots: ``int64`` ``(micro-batches, rows)``, documents every row can still take.

    Example::

        >>> largest_room(np.array([[1, 3], [2, 0]]), np.array([[1, 0], [1, 1]]))
        2
    """
    top = -1
    for m in range(free.shape[0]):
        for k in range(free.shape[1]):
            if slots[m, k] > 0:
                top = max(top, free[m, k])
    return top


@njit(cache=True)
def lpt_place(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    tight: bool,
    free: np.ndarray,
    slots: np.ndarray,
    micro_loads: np.ndarray,
    room: np.ndarray,
    loads: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
) -> bool:
    """LPT under row capacities from the given state: in ``order``, each document to the
    rank whose time after taking it is lowest among those with a row it fits in (there by
    ``fit_micro``). ``False`` if a document fits nowhere (the outputs are then partial).
    Every state array is updated in place; ``pack_attempt`` starts it empty,
    ``chronica.core.packing.context_kernels.place_loaded`` from chunks already placed.

    Args:
        lengths: ``int64`` tokens per document (or unit: a group kept whole).
        costs: ``float64`` predicted cost per document.
        docs: ``int64`` documents per unit (counted against the rows' ``slots``).
        order: the documents to place, costliest first.
        speeds: ``float64`` relative speed per rank (``> 0``).
        tight: best fit (see ``fit_micro``).
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        micro_loads: ``float64`` ``(ranks, micro-batches)`` cost of every micro-batch.
        room: ``int64`` every rank's ``largest_room``.
        loads: ``float64`` every rank's cost.
        rank: ``int64`` output, every document's rank.
        micro: ``int64`` output, every document's micro-batch.
        row: ``int64`` output, every document's row.

    Example: ``pack_attempt``'s first pass.
    """
    w = speeds.shape[0]
    refused = np.zeros(w, np.bool_)
    for t in range(order.shape[0]):
        i = order[t]
        m, k, best = -1, -1, -1
        while m < 0:
            best = -1
            best_time = np.inf
            for r in range(w):
                if room[r] >= lengths[i] and not refused[r]:
                    time = (loads[r] + costs[i]) / speeds[r]
                    if time < best_time:
                        best, best_time = r, time
            if best < 0:
                return False
            # ``room`` counts rows with a free document slot; a group needs more of them.
            m, k = fit_micro(free[best], slots[best], micro_loads[best], lengths[i], docs[i], tight)
            refused[best] = m < 0
        refused[:] = False
        rank[i], micro[i], row[i] = best, m, k
        free[best, m, k] -= lengths[i]
        slots[best, m, k] -= docs[i]
        micro_loads[best, m] += costs[i]
        loads[best] += costs[i]
        room[best] = largest_room(free[best], slots[best])
    return True


@njit(cache=True, nogil=True)
def pack_attempt(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    num_micro: int,
    rows: int,
    row_length: int,
    row_docs: int,
    tight: bool,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
) -> bool:
    """Place one step's documents at ``num_micro`` micro-batches per rank: LPT under row
    capacities (each document to the rank whose time after taking it is lowest among those
    with a row it fits in; there by ``fit_micro``), then ``refine``. ``False`` if a document
    fits nowhere (the outputs are then partial).

    Args:
        lengths: ``int64`` tokens per document (or unit: a group kept whole).
        costs: ``float64`` predicted cost per document.
        docs: ``int64`` documents per unit (they count against ``row_docs``).
        order: the documents by descending cost (``chronica.core.kernels.argsort_descending``).
        speeds: ``float64`` relative speed per rank (``> 0``).
        num_micro: micro-batches per rank.
        rows: rows per micro-batch.
        row_length: tokens per row.
        row_docs: the most documents in one row.
        tight: best fit (see ``fit_micro``).
        rank: ``int64`` output, every document's rank.
        micro: ``int64`` output, every document's micro-batch within its rank.
        row: ``int64`` output, every document's row within its micro-batch.
        loads: ``float64`` output, every rank's total cost.

    Example::

        >>> rank, micro, row = (np.empty(3, np.int64) for _ in range(3))
        >>> loads = np.empty(2)
        >>> pack_attempt(np.array([3, 2, 2]), np.array([3.0, 2.0, 2.0]), np.ones(3, np.int64),
        ...              np.arange(3), np.ones(2), 1, 1, 4, 4, False, rank, micro, row, loads)
        True
        >>> rank.tolist(), loads.tolist()
        ([0, 1, 1], [3.0, 4.0])
    """
    w = speeds.shape[0]
    n = lengths.shape[0]
    free = np.full((w, num_micro, rows), row_length, np.int64)
    slots = np.full((w, num_micro, rows), row_docs, np.int64)
    micro_loads = np.zeros((w, num_micro))
    room = np.full(w, row_length, np.int64)
    loads[:] = 0.0
    if not lpt_place(
        lengths, costs, docs, order, speeds, tight, free, slots, micro_loads, room, loads,
        rank, micro, row,
    ):  # fmt: skip
        return False
    refine(
        lengths, costs, docs, speeds, tight, free, slots, micro_loads, room, rank, micro, row,
        loads, work_budget(n, w),
    )  # fmt: skip
    return True


@njit(cache=True)
def refine(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    speeds: np.ndarray,
    tight: bool,
    free: np.ndarray,
    slots: np.ndarray,
    micro_loads: np.ndarray,
    room: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    loads: np.ndarray,
    budget: int,
) -> None:
    """Refinement: while the slowest rank is more than 1e-7 above the mean time and a move of
    one of its documents to another rank, or a trade (see ``best_trade``), lowers the larger
    of the two ranks' times, make the best such move; stop once more than ``budget``
    candidates were looked at (each iteration counts ``n`` plus ``W`` per document of the
    slowest rank for its moves, and ``trade_work`` for each trade search). Every array is
    updated in place.

    Args:
        lengths: ``int64`` tokens per document.
        costs: ``float64`` predicted cost per document.
        docs: ``int64`` documents per unit.
        speeds: ``float64`` relative speed per rank.
        tight: best fit for moved documents (see ``fit_micro``).
        free: ``int64`` ``(ranks, micro-batches, rows)`` free tokens of every row.
        slots: ``int64`` ``(ranks, micro-batches, rows)`` documents every row can still take.
        micro_loads: ``float64`` ``(ranks, micro-batches)`` cost of every micro-batch.
        room: ``int64`` per rank, ``largest_room`` of its rows.
        rank: every document's rank.
        micro: every document's micro-batch.
        row: every document's row.
        loads: every rank's total cost.
        budget: the most candidates to look at (``pack_attempt`` passes ``work_budget``).

    Example: ``pack_attempt`` ends with it; ``tests/helpers/reference.py`` holds its
    pure-Python twin.
    """
    w = speeds.shape[0]
    n = lengths.shape[0]
    if w < 2 or n == 0:
        return
    mean = loads.sum() / speeds.sum()
    bound = mean * (1.0 + _CLOSE_ENOUGH)
    fastest = speeds.max()
    work = 0
    cells = np.zeros(free.size, np.int64)
    # Every rank's documents in ascending order, rank after rank (``seg[start[r]:start[r+1]]``),
    # so that an iteration visits the slowest rank's documents, not every document.
    seg, start = _by_rank(rank, w)
    for _ in range(4 * n + 16):
        times = loads / speeds
        a = int(np.argmax(times))
        top = times[a]
        if top <= bound or work > budget:
            return
        # The best move of one document of ``a`` to another rank with room for it.
        gain, move_i, move_b = top * _REL_TOL, -1, -1
        num_mine = start[a + 1] - start[a]
        lightest = np.inf
        for b in range(w):
            if b != a:
                lightest = min(lightest, times[b])
        for x in range(start[a], start[a + 1]):
            i = seg[x]
            after_a = (loads[a] - costs[i]) / speeds[a]
            # No rank ends below ``lightest + cost / fastest``: skip ``i`` if even that gains
            # too little (the margin covers rounding, so the scan's choice is unchanged).
            floor = max(after_a, lightest + costs[i] / fastest) * (1.0 - _ROUNDING)
            if top - floor <= gain:
                continue
            for b in range(w):
                if b == a or room[b] < lengths[i]:
                    continue
                if docs[i] > 1 and fit_micro(free[b], slots[b], micro_loads[b], lengths[i],
                                             docs[i], tight)[0] < 0:  # fmt: skip
                    continue
                new_top = max(after_a, (loads[b] + costs[i]) / speeds[b])
                if top - new_top > gain:
                    gain, move_i, move_b = top - new_top, i, b
        work += n + num_mine * w
        if move_i >= 0:
            i, b = move_i, move_b
            free[a, micro[i], row[i]] += lengths[i]
            slots[a, micro[i], row[i]] += docs[i]
            micro_loads[a, micro[i]] -= costs[i]
            m, k = fit_micro(free[b], slots[b], micro_loads[b], lengths[i], docs[i], tight)
            rank[i], micro[i], row[i] = b, m, k
            free[b, m, k] -= lengths[i]
            slots[b, m, k] -= docs[i]
            micro_loads[b, m] += costs[i]
            loads[a] -= costs[i]
            loads[b] += costs[i]
            room[a] = largest_room(free[a], slots[a])
            room[b] = largest_room(free[b], slots[b])
            _relocate(seg, start, i, a, b)
            continue
        # No move helps: trade a document of ``a`` for one cheaper document, or two of one
        # row, of another rank, each side taking the other's row slot. The lightest ranks
        # are searched first, then (for steps small enough) every rank.
        partner = np.zeros(w, np.bool_)
        partner[np.argsort(times, kind="mergesort")[:_PARTNERS]] = True
        partner[a] = False
        mine = seg[start[a] : start[a + 1]]
        theirs = _documents_of(seg, start, partner)
        work += num_mine * theirs.shape[0]  # ``trade_work`` without pairs
        trade = trade_among(
            lengths, costs, docs, speeds, free, slots, rank, micro, row, loads, a, mine, theirs,
            False, gain,
        )  # fmt: skip
        worth = top > mean * (1.0 + _WORTH_MORE)
        if trade[0] < 0 and worth:
            work += trade_work(rank, micro, row, partner, num_mine, cells, free.shape, True)
            trade = trade_among(
                lengths, costs, docs, speeds, free, slots, rank, micro, row, loads, a, mine,
                theirs, True, gain,
            )  # fmt: skip
        if trade[0] < 0 and worth and w > _PARTNERS + 1 and n <= _WIDE_SEARCH_MAX:
            partner[:] = True
            partner[a] = False
            theirs = _documents_of(seg, start, partner)
            work += num_mine * theirs.shape[0]
            trade = trade_among(
                lengths, costs, docs, speeds, free, slots, rank, micro, row, loads, a, mine,
                theirs, False, gain,
            )  # fmt: skip
        i, j, k = trade
        if i < 0:
            return
        b = rank[j]
        if k >= 0:
            _relocate(seg, start, k, b, a)
        _replace(seg, start[a], start[a + 1], i, j)
        _replace(seg, start[b], start[b + 1], j, i)
        taken = lengths[j] + (lengths[k] if k >= 0 else 0)
        counted = docs[j] + (docs[k] if k >= 0 else 0)
        given = costs[j] + (costs[k] if k >= 0 else 0.0)
        d = costs[i] - given
        free[a, micro[i], row[i]] += lengths[i] - taken
        free[b, micro[j], row[j]] += taken - lengths[i]
        slots[a, micro[i], row[i]] += docs[i] - counted
        slots[b, micro[j], row[j]] += counted - docs[i]
        micro_loads[a, micro[i]] -= d
        micro_loads[b, micro[j]] += d
        slot_micro, slot_row = micro[i], row[i]
        rank[i], micro[i], row[i] = b, micro[j], row[j]
        rank[j], micro[j], row[j] = a, slot_micro, slot_row
        if k >= 0:
            rank[k], micro[k], row[k] = a, slot_micro, slot_row
        loads[a] -= d
        loads[b] += d
        room[a] = largest_room(free[a], slots[a])
        room[b] = largest_room(free[b], slots[b])


@njit(cache=True)
def work_budget(n: int, w: int) -> int:
    """The refinement's work bound for ``n`` documents on ``w`` ranks:
    ``max(2**22, n · (1024 + 4·w))`` candidate moves and trades.

    Args:
        n: documents (units) of the step.
        w: ranks.

    Example::

        >>> work_budget(8192, 64)
        10485760
    """
    return max(_WORK_FLOOR, n * (_WORK_PER_DOCUMENT + _WORK_PER_RANK * w))


@njit(cache=True)
def _by_rank(rank: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    # Every rank's documents ascending, rank after rank, and where each rank's run starts.
    start = np.zeros(w + 1, np.int64)
    for i in range(rank.shape[0]):
        start[rank[i] + 1] += 1
    for r in range(w):
        start[r + 1] += start[r]
    filled = start[:-1].copy()
    seg = np.empty(rank.shape[0], np.int64)
    for i in range(rank.shape[0]):
        seg[filled[rank[i]]] = i
        filled[rank[i]] += 1
    return seg, start


@njit(cache=True)
def _documents_of(seg: np.ndarray, start: np.ndarray, partner: np.ndarray) -> np.ndarray:
    # The documents of the ``partner`` ranks, ascending.
    total = 0
    for r in range(partner.shape[0]):
        if partner[r]:
            total += start[r + 1] - start[r]
    out = np.empty(total, np.int64)
    filled = 0
    for r in range(partner.shape[0]):
        if partner[r]:
            size = start[r + 1] - start[r]
            out[filled : filled + size] = seg[start[r] : start[r + 1]]
            filled += size
    out.sort()
    return out


@njit(cache=True)
def _replace(seg: np.ndarray, lo: int, hi: int, old: int, new: int) -> None:
    # In the ascending run ``seg[lo:hi]``, document ``old`` becomes ``new``, kept ascending.
    x = lo
    while seg[x] != old:
        x += 1
    while x > lo and seg[x - 1] > new:
        seg[x] = seg[x - 1]
        x -= 1
    while x + 1 < hi and seg[x + 1] < new:
        seg[x] = seg[x + 1]
        x += 1
    seg[x] = new


@njit(cache=True)
def _relocate(seg: np.ndarray, start: np.ndarray, doc: int, src: int, dst: int) -> None:
    # Document ``doc`` leaves rank ``src``'s run for rank ``dst``'s (ascending in both).
    x = start[src]
    while seg[x] != doc:
        x += 1
    if src < dst:
        # Shift every run between down by one; ``doc`` enters at the end of ``dst``'s.
        for y in range(x, start[dst + 1] - 1):
            seg[y] = seg[y + 1]
        for r in range(src + 1, dst + 1):
            start[r] -= 1
        seg[start[dst + 1] - 1] = doc
        _sift(seg, start[dst], start[dst + 1], start[dst + 1] - 1)
    else:
        for y in range(x, start[dst + 1], -1):
            seg[y] = seg[y - 1]
        for r in range(dst + 1, src + 1):
            start[r] += 1
        seg[start[dst + 1] - 1] = doc
        _sift(seg, start[dst], start[dst + 1], start[dst + 1] - 1)


@njit(cache=True)
def _sift(seg: np.ndarray, lo: int, hi: int, x: int) -> None:
    # ``seg[x]`` moved down to its ascending place in ``seg[lo:hi]``.
    doc = seg[x]
    while x > lo and seg[x - 1] > doc:
        seg[x] = seg[x - 1]
        x -= 1
    seg[x] = doc
