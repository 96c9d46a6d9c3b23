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
least as many documents as cells. Then every micro-batch is leveled across the ranks
(``chronica.core.packing.lockstep_level``: moves and trades between its slowest and its
fastest cells), and units of
the slowest cells trade places with cheaper units of other micro-batches where those have
slack (``chronica.core.packing.lockstep_relief``), for at most as many candidate looks as
the step has units (and at least ``_RELIEF_LOOKS``), so the planning time stays bounded.
On small steps two more constructions are refined the same way, and the shortest plan is
kept (the earlier on ties): where units × cells is at most ``_RANKED_LOOKS``, the rank
kernel's plan with every rank's micro-batches by descending cost
(``chronica.core.packing.lockstep_ranked``: alike micro-batches below the cap, which the
leveling can even out where documents are short), and where it is at most ``_LPT_LOOKS``,
a lockstep LPT (``chronica.core.packing.lockstep_lpt``: each unit where its micro-batch's
maximum rises least, then where its rank's sum is lowest). Where ranks are of one speed and
the costliest unit costs at most the mean cell (``total / cells``: units small against a
micro-batch, as on real length sets), so does a differencing construction
(``chronica.core.packing.lockstep_kk``: Karmarkar–Karp into ranks, then each rank's units
into its micro-batches, sorted by cost), whatever the step's size: its work grows as
``units · log(units)``, and the passes after it are bounded as above. They also stand in
where the greedy leaves a unit without a cell, so the step needs no extra micro-batch.
Last, on ranks of one speed, where units × cells is at most ``_REBUILD_STEP`` and the step is
more than ``_REBUILD_GAP`` above ``max(mean, costliest unit)``, the rebuild pass
(``chronica.core.packing.lockstep_rebuild``): one micro-batch keeps its units, its costliest
cells lowered, and all other units are planned again, by the above, into the other
micro-batches; at most ``_REBUILD_TRIES`` such plans, the first shorter one kept each time.
Then, under the same gap at any size, every micro-batch in turn (by descending idle time)
sheds the same way and only the shed units move to the other micro-batches, each where it
raises a maximum least (``lockstep_rebuild.spread_column``), within ``_SPREAD_LOOKS``
units × cells in all. Last, under the same gap, where the step has units longer than half
the cap, the long-first construction (``chronica.core.packing.lockstep_long``): the long
units fill the first ``q = ceil(long / ranks)`` micro-batches costliest first, each of those
micro-batches' other cells is filled with short units toward its maximum, and the other
units are planned into the other micro-batches; the whole replaces the plan where its step
is shorter. The rest is planned by the differencing construction, refined (a fraction of a
plan's time), where its units are small against a cell and its units × cells are at most
``_LPT_LOOKS``; where that fails or does not apply, by all of the above (about one more plan
of the step), only where the filled maxima plus the rest's mean are ``_LONG_GAIN`` below the
plan; and not at all where they are not below it, or where the rest holds more tokens than
the other micro-batches.

The cells of ranks of one speed are kept, per micro-batch, sorted by cost (a "ladder",
``chronica.core.packing.ladder``), so the fullest cell a document fits under the maximum is
found by bisection, and so is the new place of a cell that took a document (the rungs it
passes shift down as one block, not one swap at a time); a micro-batch whose largest room is
too small for the document is skipped without a walk down its ladder. A step of 16,384
documents into 256 ranks plans in tens of milliseconds, not the seconds a scan of every
cell per document takes.

Documents that fit no row make the attempt fail (``False``); ``pack_step`` then retries with
more micro-batches. The result depends on the inputs only (deterministic on every machine).
Pure-Python twins are in ``tests/helpers/lockstep_reference.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.packing.kernels import largest_room
from chronica.core.packing.ladder import climb, rung, speed_classes
from chronica.core.packing.lockstep_greedy import best_cell, best_empty_cell
from chronica.core.packing.lockstep_kk import kk_cells
from chronica.core.packing.lockstep_level import level_steps
from chronica.core.packing.lockstep_long import fill_long, long_micro_batches
from chronica.core.packing.lockstep_lpt import lpt_cells
from chronica.core.packing.lockstep_ranked import ranked_cells
from chronica.core.packing.lockstep_rebuild import (
    by_idle,
    moving_units,
    shed_column,
    spread_column,
)
from chronica.core.packing.lockstep_relief import relieve_columns

__all__ = ["level_steps", "lockstep_attempt", "speed_classes"]

# The relief pass looks at as many candidate units as the step has, and at least this many.
_RELIEF_LOOKS = 8192
# The LPT construction runs where units × cells is at most this (it may look at every cell;
# above it, it took a third of a 16,384-unit step's time at 256 ranks and rarely won).
_LPT_LOOKS = 1 << 23
# The sorted rank plan runs where units × cells is at most this.
_RANKED_LOOKS = 1 << 19
# The rebuild pass runs on ranks of one speed where units × cells is at most this; it tries
# at most ``_REBUILD_TRIES`` plans of at most ``_REBUILD_LOOKS`` units × cells in all, each
# lowering a micro-batch's costliest cells by one of ``_REBUILD_LEVELS``.
_REBUILD_STEP = 1 << 16
_REBUILD_GAP = 0.01
_REBUILD_TRIES = 3
_REBUILD_LOOKS = 1 << 19
_REBUILD_LEVELS = (1, 2, 4, 8)
# Then, at any size, ``spread_column`` on every micro-batch (by descending idle time), each
# lowering up to ``_SPREAD_LEVELS`` cells, within ``_SPREAD_LOOKS`` units × cells in all.
_SPREAD_LEVELS = 8
_SPREAD_LOOKS = 1 << 16
# Where the differencing does not plan the rest of the long-first construction, every
# construction does, only where its bound is this far (relative) below the plan.
_LONG_GAIN = 0.01
# The constructions ``_instead`` tries.
_RANKED, _LPT, _KK = 0, 1, 2


@njit(cache=True, nogil=True)
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
    times ``num_micro`` micro-batches: the greedy of the module docstring. ``False`` if a
    unit fits nowhere (the outputs are then partial).

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
    fits = _planned(
        lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs, rank, micro,
        row, cells,
    )  # fmt: skip
    if fits and _gap(costs, speeds, cells):
        _long_first(lengths, costs, docs, order, speeds, rows, row_length, row_docs, rank,
                    micro, row, cells)  # fmt: skip
    return fits


@njit(cache=True)
def _gap(costs: np.ndarray, speeds: np.ndarray, cells: np.ndarray) -> bool:
    # Ranks of one speed and a plan more than ``_REBUILD_GAP`` above ``max(mean, costliest
    # unit)``: where the rebuild, the spread and the long-first construction run.
    w, num_micro = cells.shape
    if not costs.shape[0] or w < 2 or num_micro < 2 or not (speeds == speeds[0]).all():
        return False
    floor = max(costs.sum() / w, costs.max()) / speeds[0]
    return _step(cells, speeds) > floor * (1 + _REBUILD_GAP)


@njit(cache=True)
def _planned(
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
    # ``lockstep_attempt`` before the long-first construction: the constructions, then the
    # rebuild and the spread.
    fits = _attempt(
        lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs, rank, micro,
        row, cells,
    )  # fmt: skip
    if not fits or not _gap(costs, speeds, cells):
        return fits
    w, n = speeds.shape[0], lengths.shape[0]
    if n * w * num_micro <= _REBUILD_STEP:
        _rebuild(lengths, costs, docs, order, speeds, rows, row_length, row_docs, rank, micro,
                 row, cells)  # fmt: skip
    free = np.full((w, num_micro, rows), row_length, np.int64)
    slots = np.full((w, num_micro, rows), row_docs, np.int64)
    for i in range(n):
        free[rank[i], micro[i], row[i]] -= lengths[i]
        slots[rank[i], micro[i], row[i]] -= docs[i]
    looks = 0
    for k in by_idle(cells):
        if looks > _SPREAD_LOOKS:
            break
        looks += spread_column(lengths, costs, docs, order, free, slots, rank, micro, row,
                               cells, k, _SPREAD_LEVELS, _SPREAD_LOOKS - looks)  # fmt: skip
    return fits


@njit(cache=True)
def _attempt(
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
    # ``lockstep_attempt`` before the rebuild pass: the greedy and the other constructions,
    # each refined, the shortest kept.
    w = speeds.shape[0]
    n = lengths.shape[0]
    free = np.full((w, num_micro, rows), row_length, np.int64)
    slots = np.full((w, num_micro, rows), row_docs, np.int64)
    room = np.full((w, num_micro), row_length if row_docs > 0 else -1, np.int64)
    count = np.zeros((w, num_micro), np.int64)
    # Every micro-batch's largest room and how many of its cells have it: a micro-batch
    # where no cell has room for a unit is skipped without a walk down its ladder.
    room_top = room[0].copy()
    room_at = np.full(num_micro, w, np.int64)
    cells[:, :] = 0.0
    top = np.zeros(num_micro)
    empty = w * num_micro
    # Ranks of one speed, per micro-batch, kept sorted by (cell cost, rank): the best cell
    # of a class is then found by bisection instead of a scan of every cell.
    level, members, size = speed_classes(speeds)
    g_count = size.shape[0]
    ladder = np.empty((num_micro, g_count, members.shape[1]), np.int64)
    for k in range(num_micro):
        ladder[k] = members
    r = 0  # the last unit's rank; -1 where a unit fit nowhere
    for t in range(n):
        i = order[t]
        if empty > 0 and n - t <= empty:
            r, k, q, time = best_empty_cell(
                lengths[i], costs[i], docs[i], speeds, free, slots, count, cells, top
            )
        else:
            r, k, q, time = best_cell(
                lengths[i], costs[i], docs[i], speeds, free, slots, room, cells, top,
                ladder, size, level, room_top,
            )  # fmt: skip
        if r < 0:
            break
        rank[i], micro[i], row[i] = r, k, q
        free[r, k, q] -= lengths[i]
        slots[r, k, q] -= docs[i]
        before = room[r, k]
        room[r, k] = largest_room(free[r, k : k + 1], slots[r, k : k + 1])
        if room[r, k] != before and before == room_top[k]:
            room_at[k] -= 1
            if room_at[k] == 0:
                room_top[k] = room[:, k].max()
                room_at[k] = np.sum(room[:, k] == room_top[k])
        if count[r, k] == 0:
            empty -= 1
        count[r, k] += 1
        x = rung(cells[:, k], ladder[k, level[r]], size[level[r]], r)
        cells[r, k] += costs[i]
        top[k] = max(top[k], time)
        climb(cells[:, k], ladder[k, level[r]], size[level[r]], x, r)
    fits = r >= 0
    if fits:
        _refine(lengths, costs, docs, order, speeds, free, slots, rank, micro, row, cells)
    work = n * w * num_micro
    if work <= _RANKED_LOOKS:
        fits = _instead(
            _RANKED, lengths, costs, docs, order, speeds, rows, row_length, row_docs, rank,
            micro, row, cells, fits,
        ) or fits  # fmt: skip
    if work <= _LPT_LOOKS:
        fits = _instead(
            _LPT, lengths, costs, docs, order, speeds, rows, row_length, row_docs, rank,
            micro, row, cells, fits,
        ) or fits  # fmt: skip
    if _small_units(costs, w * num_micro):
        fits = _instead(
            _KK, lengths, costs, docs, order, speeds, rows, row_length, row_docs, rank, micro,
            row, cells, fits,
        ) or fits  # fmt: skip
    return fits


@njit(cache=True)
def _rebuild(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    rows: int,
    row_length: int,
    row_docs: int,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
) -> None:
    # The rebuild pass (``chronica.core.packing.lockstep_rebuild``): micro-batch ``k`` kept,
    # its ``j`` costliest cells lowered, the other units planned again into the other
    # micro-batches; the first shorter plan replaces the outputs and the tries start again,
    # at most ``_REBUILD_TRIES`` of them and ``_REBUILD_LOOKS`` units × cells planned again.
    w, num_micro = cells.shape
    n = lengths.shape[0]
    stay = np.empty(n, np.bool_)
    column = np.empty(w)
    trial = np.empty_like(cells)
    tries, looks = 0, 0
    improved = True
    while improved:
        improved = False
        for k in by_idle(cells):
            for j in _REBUILD_LEVELS:
                if j >= w or improved:
                    break
                shed_column(costs, rank, micro, cells, k, j, stay, column)
                units, sub_order = moving_units(order, stay)
                m = units.shape[0]
                looks += m * w * (num_micro - 1)
                tries += 1
                if tries > _REBUILD_TRIES or looks > _REBUILD_LOOKS:
                    return
                sub_rank = np.empty(m, np.int64)
                sub_micro = np.empty(m, np.int64)
                sub_row = np.empty(m, np.int64)
                sub_cells = np.empty((w, num_micro - 1))
                if not _attempt(
                    lengths[units], costs[units], docs[units], sub_order, speeds, num_micro - 1,
                    rows, row_length, row_docs, sub_rank, sub_micro, sub_row, sub_cells,
                ):  # fmt: skip
                    continue
                trial[:, :k] = sub_cells[:, :k]
                trial[:, k] = column
                trial[:, k + 1 :] = sub_cells[:, k:]
                if _step(trial, speeds) >= _step(cells, speeds):
                    continue
                for t in range(m):
                    i = units[t]
                    rank[i], row[i] = sub_rank[t], sub_row[t]
                    micro[i] = sub_micro[t] + (sub_micro[t] >= k)
                cells[:, :] = trial
                improved = True
            if improved:
                break


@njit(cache=True)
def _long_first(
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    rows: int,
    row_length: int,
    row_docs: int,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
) -> None:
    # The long-first construction (``chronica.core.packing.lockstep_long``): the long units'
    # ``q`` micro-batches filled, the other units planned (``_planned``) into the other
    # micro-batches; it replaces the outputs where its lockstep step is shorter and, where
    # the step has a unit for every cell, it leaves none empty.
    w, num_micro = cells.shape
    n = lengths.shape[0]
    q = long_micro_batches(lengths, rows * row_length, w)
    if q == 0 or q >= num_micro:
        return
    free = np.full((w, num_micro, rows), row_length, np.int64)
    slots = np.full((w, num_micro, rows), row_docs, np.int64)
    other_rank = np.empty(n, np.int64)
    other_micro = np.empty(n, np.int64)
    other_row = np.empty(n, np.int64)
    other = np.zeros((w, num_micro))
    used = np.zeros(n, np.bool_)
    if not fill_long(lengths, costs, docs, order, rows * row_length, q, free, slots, other_rank,
                     other_micro, other_row, other, used):  # fmt: skip
        return
    # No plan of the units left into the other micro-batches is shorter than their mean
    # rank sum, and none fits where they hold more tokens than those micro-batches.
    rest, tokens = 0.0, 0
    for i in range(n):
        if not used[i]:
            rest += costs[i]
            tokens += lengths[i]
    if tokens > w * (num_micro - q) * rows * row_length:
        return
    bound = rest / w
    for k in range(q):
        bound += other[:, k].max()
    plan = _step(cells, speeds)
    if bound / speeds[0] >= plan:
        return
    units, sub_order = moving_units(order, used)
    m = units.shape[0]
    if not m:
        return
    sub_costs = costs[units]
    sub_rank = np.empty(m, np.int64)
    sub_micro = np.empty(m, np.int64)
    sub_row = np.empty(m, np.int64)
    sub_cells = np.empty((w, num_micro - q))
    # The rest by the differencing (a fraction of a plan's time) where its units are small
    # against a cell and the step is not large (there it can take a plan's time to fail);
    # where that fails or does not apply, by every construction, only where the bound is
    # ``_LONG_GAIN`` below the plan (what less could gain would not pay for one more plan).
    spare = w * (num_micro - q)
    differencing = m * spare <= _LPT_LOOKS and _small_units(sub_costs, spare)
    if not (differencing and _instead(
        _KK, lengths[units], sub_costs, docs[units], sub_order, speeds, rows, row_length,
        row_docs, sub_rank, sub_micro, sub_row, sub_cells, False,
    )):  # fmt: skip
        if bound / speeds[0] >= plan * (1 - _LONG_GAIN) or not _planned(
            lengths[units], sub_costs, docs[units], sub_order, speeds, num_micro - q, rows,
            row_length, row_docs, sub_rank, sub_micro, sub_row, sub_cells,
        ):  # fmt: skip
            return
    for t in range(m):
        i = units[t]
        other_rank[i], other_micro[i], other_row[i] = sub_rank[t], sub_micro[t] + q, sub_row[t]
    other[:, q:] = sub_cells
    if _step(other, speeds) >= _step(cells, speeds):
        return
    if n >= w * num_micro:
        count = np.zeros((w, num_micro), np.int64)
        for i in range(n):
            count[other_rank[i], other_micro[i]] += 1
        if count.min() == 0:
            return
    rank[:], micro[:], row[:], cells[:, :] = other_rank, other_micro, other_row, other


@njit(cache=True)
def _refine(
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
) -> None:
    # The passes after a construction: leveling, then relief between micro-batches.
    level_steps(lengths, costs, docs, speeds, free, slots, rank, micro, row, cells)
    relieve_columns(
        lengths, costs, docs, order, speeds, free, slots, rank, micro, row, cells,
        max(lengths.shape[0], _RELIEF_LOOKS),
    )  # fmt: skip


@njit(cache=True)
def _instead(
    which: int,
    lengths: np.ndarray,
    costs: np.ndarray,
    docs: np.ndarray,
    order: np.ndarray,
    speeds: np.ndarray,
    rows: int,
    row_length: int,
    row_docs: int,
    rank: np.ndarray,
    micro: np.ndarray,
    row: np.ndarray,
    cells: np.ndarray,
    fits: bool,
) -> bool:
    # Another construction (``which``: the sorted rank plan, the LPT or the differencing),
    # refined the same way,
    # replaces the outputs where it fits and they do not, or where its lockstep step is
    # shorter: True where it did.
    w, num_micro = cells.shape
    n = lengths.shape[0]
    free = np.empty((w, num_micro, rows), np.int64)
    slots = np.empty_like(free)
    other_rank = np.empty(n, np.int64)
    other_micro = np.empty(n, np.int64)
    other_row = np.empty(n, np.int64)
    other = np.empty_like(cells)
    if which == _LPT:
        built = lpt_cells(
            lengths, costs, docs, order, speeds, row_length, row_docs, free, slots, other_rank,
            other_micro, other_row, other,
        )  # fmt: skip
    elif which == _RANKED:
        built = ranked_cells(
            lengths, costs, docs, order, speeds, row_length, row_docs, free, slots, other_rank,
            other_micro, other_row, other,
        )  # fmt: skip
    else:
        built = kk_cells(
            lengths, costs, docs, order, speeds, row_length, row_docs, free, slots, other_rank,
            other_micro, other_row, other,
        )  # fmt: skip
    if not built:
        return False
    _refine(lengths, costs, docs, order, speeds, free, slots, other_rank, other_micro,
            other_row, other)  # fmt: skip
    if fits and _step(other, speeds) >= _step(cells, speeds):
        return False
    rank[:], micro[:], row[:], cells[:, :] = other_rank, other_micro, other_row, other
    return True


@njit(cache=True)
def _small_units(costs: np.ndarray, cells: int) -> bool:
    # Where the differencing construction applies: units, and none costlier than the mean
    # of ``cells`` cells.
    return costs.shape[0] > 0 and costs.max() * cells <= costs.sum()


@njit(cache=True)
def _step(cells: np.ndarray, speeds: np.ndarray) -> float:
    # The lockstep step: the sum over micro-batches of the slowest cell's time.
    total = 0.0
    for k in range(cells.shape[1]):
        high = 0.0
        for r in range(cells.shape[0]):
            high = max(high, cells[r, k] / speeds[r])
        total += high
    return total
