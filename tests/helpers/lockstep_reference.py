"""Pure-Python twin of ``chronica.core.packing.lockstep``: the lockstep greedy on lists."""

from __future__ import annotations

import copy
import heapq

import numpy as np
import reference

LPT_LOOKS = 1 << 23  # lockstep._LPT_LOOKS
RANKED_LOOKS = 1 << 19  # lockstep._RANKED_LOOKS
REBUILD_STEP = 1 << 16  # lockstep._REBUILD_STEP
REBUILD_GAP = 0.01  # lockstep._REBUILD_GAP
REBUILD_TRIES = 3  # lockstep._REBUILD_TRIES
REBUILD_LOOKS = 1 << 19  # lockstep._REBUILD_LOOKS
REBUILD_LEVELS = (1, 2, 4, 8)  # lockstep._REBUILD_LEVELS
SPREAD_LEVELS = 8  # lockstep._SPREAD_LEVELS
SPREAD_LOOKS = 1 << 16  # lockstep._SPREAD_LOOKS
LONG_GAIN = 0.01  # lockstep._LONG_GAIN


def lockstep_pack(lengths, costs, docs, speeds, num_micro, rows, row_length, row_docs):
    """``lockstep_attempt``: ``(rank, micro, row, cells)`` lists, or ``None`` if a unit fits
    no cell: ``planned``, then ``long_first``."""
    order = [int(i) for i in reference.descending_order(np.asarray(costs))]
    best = planned(lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs)
    if best is not None and gap(costs, speeds, best[3]):
        long_first(lengths, costs, docs, order, speeds, rows, row_length, row_docs, *best)
    return best


def gap(costs, speeds, cells):
    """``lockstep._gap``: ranks of one speed and a step more than ``REBUILD_GAP`` above
    ``max(mean, costliest unit)``."""
    n, w, num_micro = len(costs), len(speeds), len(cells[0])
    if not n or w < 2 or num_micro < 2 or len(set(speeds)) > 1:
        return False
    return step(cells, speeds) > max(sum(costs) / w, max(costs)) / speeds[0] * (1 + REBUILD_GAP)


def planned(lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs):
    """``lockstep._planned``: ``constructions_pack``, then where ``gap`` holds, on steps of
    at most ``REBUILD_STEP`` units × cells ``rebuild``, and ``spread_column``."""
    best = constructions_pack(
        lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs
    )
    n, w = len(lengths), len(speeds)
    if best is None:
        return None
    if not gap(costs, speeds, best[5]):
        return best[2:]
    rank, micro, row, cells = best[2:]
    if n * w * num_micro <= REBUILD_STEP:
        rebuild(lengths, costs, docs, order, speeds, rows, row_length, row_docs, *best[2:])
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    for i in range(n):
        free[rank[i]][micro[i]][row[i]] -= lengths[i]
        slots[rank[i]][micro[i]][row[i]] -= docs[i]
    looks = 0
    for k in by_idle(cells):
        if looks > SPREAD_LOOKS:
            break
        looks += spread_column(lengths, costs, docs, order, free, slots, rank, micro, row,
                               cells, k, SPREAD_LEVELS, SPREAD_LOOKS - looks)  # fmt: skip
    return best[2:]


def long_first(lengths, costs, docs, order, speeds, rows, row_length, row_docs, rank, micro,
               row, cells):  # fmt: skip
    """``lockstep._long_first`` on lists (mutated in place where the construction is kept):
    ``fill_long`` of the long units' micro-batches, then, where the other micro-batches have
    room for the other units' tokens and their mean plus the filled maxima is below the step,
    the other units into the other micro-batches: ``kk_pack``
    refined where the costliest of them costs at most their mean cell and they times the
    cells are at most ``LPT_LOOKS``; where that fails or does not apply, ``planned``, only
    where the bound is ``LONG_GAIN`` below the step; kept where shorter and, with a unit for
    every cell, none empty."""
    w, num_micro, n, cap = len(cells), len(cells[0]), len(lengths), rows * row_length
    q = -(-sum(2 * length > cap for length in lengths) // w)
    if q == 0 or q >= num_micro:
        return
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    other_rank, other_micro, other_row = [-1] * n, [-1] * n, [-1] * n
    other = [[0.0] * num_micro for _ in range(w)]
    used = [False] * n
    if not fill_long(lengths, costs, docs, order, cap, q, free, slots, other_rank, other_micro,
                     other_row, other, used):  # fmt: skip
        return
    rest = 0.0
    for i in range(n):
        rest += 0.0 if used[i] else costs[i]
    if sum(length for i, length in enumerate(lengths) if not used[i]) > w * (num_micro - q) * cap:
        return
    bound = rest / w
    for k in range(q):
        bound += max(other[r][k] for r in range(w))
    plan = step(cells, speeds)
    if bound / speeds[0] >= plan:
        return
    units = [i for i in range(n) if not used[i]]
    if not units:
        return
    where = {i: t for t, i in enumerate(units)}
    sub_lengths, sub_costs = [lengths[i] for i in units], [costs[i] for i in units]
    sub_docs, sub_order = [docs[i] for i in units], [where[i] for i in order if not used[i]]
    sub = None
    spare = num_micro - q
    if len(units) * w * spare <= LPT_LOOKS and small_units(sub_costs, w * spare):
        built = kk_pack(sub_lengths, sub_costs, sub_docs, sub_order, speeds, spare, rows,
                        row_length, row_docs)  # fmt: skip
        if built is not None:
            refine(sub_lengths, sub_costs, sub_docs, sub_order, speeds, *built)
            sub = built[2:]
    if sub is None:
        if bound / speeds[0] >= plan * (1 - LONG_GAIN):
            return
        sub = planned(sub_lengths, sub_costs, sub_docs, sub_order, speeds, spare, rows,
                      row_length, row_docs)  # fmt: skip
    if sub is None:
        return
    for t, i in enumerate(units):
        other_rank[i], other_micro[i], other_row[i] = sub[0][t], sub[1][t] + q, sub[2][t]
    for r in range(w):
        other[r][q:] = sub[3][r]
    if step(other, speeds) >= step(cells, speeds):
        return
    if n >= w * num_micro and len(set(zip(other_rank, other_micro, strict=True))) < w * num_micro:
        return
    rank[:], micro[:], row[:] = other_rank, other_micro, other_row
    for r in range(w):
        cells[r][:] = other[r]


def fill_long(lengths, costs, docs, order, cap, q, free, slots, rank, micro, row, cells, used):
    """``lockstep_long.fill_long`` on lists (mutated in place), without its skips: the long
    units (``2 · length > cap``) by ``order``, the ``t``-th to rank ``t % w`` of micro-batch
    ``t // w`` (``False`` if one fits no row there); then in each of those micro-batches the
    short units by ``order``, each to the cheapest cell (ties: the lower rank) below the
    micro-batch's costliest whose cost stays at most that one's and with a row for it."""
    w = len(cells)

    def place(i, r, k, x):
        rank[i], micro[i], row[i] = r, k, x
        free[r][k][x] -= lengths[i]
        slots[r][k][x] -= docs[i]
        cells[r][k] += costs[i]
        used[i] = True

    long = [i for i in order if 2 * lengths[i] > cap]
    for t, i in enumerate(long):
        r, k = t % w, t // w
        x = reference.fit_row(free[r][k], lengths[i], slots[r][k], docs[i])
        if x < 0:
            return False
        place(i, r, k, x)
    for k in range(q):
        target = max(cells[r][k] for r in range(w))
        for i in order:
            if used[i]:
                continue
            fits = [
                (cells[r][k], r, x)
                for r in range(w)
                if cells[r][k] < target and cells[r][k] + costs[i] <= target
                for x in [reference.fit_row(free[r][k], lengths[i], slots[r][k], docs[i])]
                if x >= 0
            ]
            if fits:
                _, r, x = min(fits)
                place(i, r, k, x)
    return True


def spread_column(lengths, costs, docs, order, free, slots, rank, micro, row, cells, k,
                  levels, budget):  # fmt: skip
    """``lockstep_rebuild.spread_column`` on lists (mutated in place where a level is kept):
    for ``j`` in ``1 .. min(levels, ranks - 1)`` while at most ``budget`` looks were spent,
    ``shed_column``, then each shed unit by ``order`` to the other micro-batches' cell keyed
    (rise of its maximum, slack below it, micro-batch, rank) with a row it fits (the fullest);
    the level of the shortest step is applied where that is shorter. Returns the looks."""
    w, num_micro = len(cells), len(cells[0])
    best_total, best, looks = sum(max(c[k2] for c in cells) for k2 in range(num_micro)), None, 0
    for j in range(1, min(levels, w - 1) + 1):
        if looks > budget:
            break
        stay, column = shed_column(costs, rank, micro, cells, k, j)
        trial_free, trial_slots, trial_cells = (copy.deepcopy(x) for x in (free, slots, cells))
        for r in range(w):
            trial_cells[r][k] = column[r]
        shed = [i for i in order if micro[i] == k and not stay[i]]
        for i in shed:
            trial_free[rank[i]][k][row[i]] += lengths[i]
            trial_slots[rank[i]][k][row[i]] += docs[i]
        top = [max(c[k2] for c in trial_cells) for k2 in range(num_micro)]
        places, fits = {}, True
        for i in shed:
            found = None
            for k2 in range(num_micro):
                if k2 == k:
                    continue
                for r in range(w):
                    looks += 1
                    time = trial_cells[r][k2] + costs[i]
                    rise = max(0.0, time - top[k2])
                    key = (rise, top[k2] - time if rise == 0.0 else 0.0)
                    if found is not None and key >= found[0]:
                        continue
                    q = reference.fit_row(
                        trial_free[r][k2], lengths[i], trial_slots[r][k2], docs[i]
                    )
                    if q >= 0:
                        found = (key, r, k2, q)
            if found is None:
                fits = False
                break
            _, r, k2, q = found
            places[i] = (r, k2, q)
            trial_free[r][k2][q] -= lengths[i]
            trial_slots[r][k2][q] -= docs[i]
            trial_cells[r][k2] += costs[i]
            top[k2] = max(top[k2], trial_cells[r][k2])
        total = sum(top) if fits else np.inf
        if total < best_total:
            best_total, best = total, (places, trial_free, trial_slots, trial_cells)
    if best is not None:
        places, trial_free, trial_slots, trial_cells = best
        for i, (r, k2, q) in places.items():
            rank[i], micro[i], row[i] = r, k2, q
        for r in range(w):
            free[r][:], slots[r][:], cells[r][:] = trial_free[r], trial_slots[r], trial_cells[r]
    return looks


def by_idle(cells):
    """``lockstep_rebuild.by_idle``: micro-batches by descending idle time, ties lower."""
    w, num_micro = len(cells), len(cells[0])
    idle = [0.0] * num_micro
    for k in range(num_micro):
        high = max(cells[r][k] for r in range(w))
        for r in range(w):
            idle[k] += high - cells[r][k]
    return sorted(range(num_micro), key=lambda k: (-idle[k], k))


def shed_column(costs, rank, micro, cells, k, j):
    """``lockstep_rebuild.shed_column``: ``(stay, column)``."""
    w = len(cells)
    stay = [m == k for m in micro]
    column = [cells[r][k] for r in range(w)]
    ranks = sorted(range(w), key=lambda r: (-cells[r][k], r))
    level = cells[ranks[j]][k]
    for r in ranks[:j]:
        units = sorted(
            (i for i in range(len(costs)) if stay[i] and rank[i] == r), key=lambda i: (costs[i], i)
        )
        y = 0
        while column[r] > level and len(units) - y > 1:
            stay[units[y]] = False
            column[r] -= costs[units[y]]
            y += 1
    return stay, column


def rebuild(lengths, costs, docs, order, speeds, rows, row_length, row_docs, rank, micro, row,
            cells):  # fmt: skip
    """``lockstep._rebuild`` on lists (mutated in place): micro-batch ``k`` (by descending
    idle) keeps its units but those its ``j`` costliest cells shed (``j`` in
    ``REBUILD_LEVELS``), the rest go through ``constructions_pack`` into the other
    micro-batches; the first shorter plan is taken and the tries start again, within
    ``REBUILD_TRIES`` tries and ``REBUILD_LOOKS`` units × cells."""
    w, num_micro = len(cells), len(cells[0])
    tries = looks = 0
    improved = True
    while improved:
        improved = False
        for k in by_idle(cells):
            for j in REBUILD_LEVELS:
                if j >= w or improved:
                    break
                stay, column = shed_column(costs, rank, micro, cells, k, j)
                units = [i for i in range(len(stay)) if not stay[i]]
                where = {i: t for t, i in enumerate(units)}
                sub_order = [where[i] for i in order if not stay[i]]
                looks += len(units) * w * (num_micro - 1)
                tries += 1
                if tries > REBUILD_TRIES or looks > REBUILD_LOOKS:
                    return
                sub = constructions_pack(
                    [lengths[i] for i in units], [costs[i] for i in units],
                    [docs[i] for i in units], sub_order, speeds, num_micro - 1, rows,
                    row_length, row_docs,
                )  # fmt: skip
                if sub is None:
                    continue
                sub_rank, sub_micro, sub_row, sub_cells = sub[2:]
                trial = [sub_cells[r][:k] + [column[r]] + sub_cells[r][k:] for r in range(w)]
                if step(trial, speeds) >= step(cells, speeds):
                    continue
                for t, i in enumerate(units):
                    rank[i], row[i] = sub_rank[t], sub_row[t]
                    micro[i] = sub_micro[t] + (sub_micro[t] >= k)
                for r in range(w):
                    cells[r][:] = trial[r]
                improved = True
            if improved:
                break


def constructions_pack(lengths, costs, docs, order, speeds, num_micro, rows, row_length,
                       row_docs):  # fmt: skip
    """``lockstep._attempt``: ``(free, slots, rank, micro, row, cells)`` lists (``free`` and
    ``slots`` those of the construction kept), or ``None`` if a unit fits no cell. The ladder
    greedy, refined; where units × cells is at most ``RANKED_LOOKS``
    (``LPT_LOOKS``), the sorted rank plan (the LPT construction) too, and where the
    costliest unit costs at most the mean cell the differencing, refined, each of which
    replaces the plan so far where that failed or where its lockstep step is shorter."""
    n, w = len(lengths), len(speeds)
    best = greedy_pack(lengths, costs, docs, speeds, num_micro, rows, row_length, row_docs)
    if best is not None:
        refine(lengths, costs, docs, order, speeds, *best)
    for limit, build in ((RANKED_LOOKS, ranked_pack), (LPT_LOOKS, lpt_pack)):
        if n * w * num_micro > limit:
            continue
        other = build(lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs)
        if other is not None:
            refine(lengths, costs, docs, order, speeds, *other)
            if best is None or step(other[5], speeds) < step(best[5], speeds):
                best = other
    if small_units(costs, w * num_micro):
        other = kk_pack(lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs)
        if other is not None:
            refine(lengths, costs, docs, order, speeds, *other)
            if best is None or step(other[5], speeds) < step(best[5], speeds):
                best = other
    return best


def small_units(costs, cells):
    """``lockstep._small_units``: units, and none costlier than the mean of ``cells``
    cells (where the differencing construction applies)."""
    # Numba sums an array in order from 0.0, as ``sum`` does.
    return bool(costs) and max(costs) * cells <= sum(costs)


def kk_pack(lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs):
    """``lockstep_kk.kk_cells``: ``(free, slots, rank, micro, row, cells)`` lists, or
    ``None`` where the speeds differ, a unit fits no row or a cell is left empty although
    the step has a unit for each. Differencing into
    ranks (runs of ``ranks`` units by ascending cost), then every rank's units into
    ``num_micro`` parts by differencing, put in rows by descending cost (a unit that fits no
    row of its part after the others, into the cheapest micro-batch it fits; then every unit
    of the rank so too, kept where its costliest micro-batch is cheaper; where one fits none
    or a part is left empty, every unit of the rank so; where one fits none again, each
    into the fullest row), the units no row of their rank took into the cheapest cell of any
    rank, every rank's micro-batches by descending cost."""
    w, n = len(speeds), len(lengths)
    if any(s != speeds[0] for s in speeds):
        return None
    ascending = list(reversed(order))
    rank, micro, row = [-1] * n, [-1] * n, [-1] * n
    for g, members in enumerate(differencing(costs, ascending, w, True)):
        for i in members:
            rank[i] = g
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    cells = [[0.0] * num_micro for _ in range(w)]
    count = [[0] * num_micro for _ in range(w)]
    for r in range(w):
        mine = [i for i in ascending if rank[i] == r]
        for g, members in enumerate(differencing(costs, mine, num_micro, False)):
            for i in members:
                micro[i] = g
        late = _fill(lengths, costs, docs, mine, "parts", free[r], slots[r], micro, row,
                     cells[r], count[r])  # fmt: skip
        if late == 0:
            continue
        top = max(cells[r])
        kept = copy.deepcopy((free[r], slots[r], cells[r], count[r]))
        kept_places = [(micro[i], row[i]) for i in mine]
        for how in ("cheapest", "tight"):
            free[r] = [[row_length] * rows for _ in range(num_micro)]
            slots[r] = [[row_docs] * rows for _ in range(num_micro)]
            cells[r] = [0.0] * num_micro
            count[r] = [0] * num_micro
            done = _fill(lengths, costs, docs, mine, how, free[r], slots[r], micro, row,
                         cells[r], count[r]) >= 0  # fmt: skip
            if done or late > 0:
                break
        if late > 0 and (not done or max(cells[r]) >= top):
            free[r], slots[r], cells[r], count[r] = kept
            for i, (k, q) in zip(mine, kept_places, strict=True):
                micro[i], row[i] = k, q
    for i in order:
        if micro[i] >= 0:
            continue
        fitting = []
        for r in range(w):
            k, q = _open_row(lengths[i], docs[i], False, free[r], slots[r], cells[r], count[r])
            if k >= 0:
                fitting.append((cells[r][k], count[r][k], r, k, q))
        if not fitting:
            return None
        _, _, r, k, q = min(fitting)
        rank[i], micro[i], row[i] = r, k, q
        free[r][k][q] -= lengths[i]
        slots[r][k][q] -= docs[i]
        cells[r][k] += costs[i]
        count[r][k] += 1
    if n >= w * num_micro and min(min(c) for c in count) == 0:
        return None
    return sorted_micro_batches(
        lengths, costs, docs, rows, row_length, row_docs, rank, micro, row, cells
    )


def _fill(lengths, costs, docs, mine, how, free, slots, micro, row, cells, count):
    """``lockstep_kk._fill`` for one rank (its lists mutated): units that fit no row of
    the rank keep ``micro = -1``; the number of units the second sweep placed, or -1 where
    a unit has no row or (but with ``"tight"``) a micro-batch is left empty although the
    rank has a unit for each."""
    num_micro = len(cells)
    waiting = []
    placed = late = 0
    for sweep in range(2 if how == "parts" else 1):
        for i in reversed(mine):
            if how == "parts" and sweep == 0:
                k = micro[i]
                q = reference.fit_row(free[k], lengths[i], slots[k], docs[i])
                if q < 0:
                    waiting.append(i)
            elif how == "parts" and i not in waiting:
                continue
            else:
                k, q = _open_row(lengths[i], docs[i], how == "tight", free, slots, cells, count)
            if q < 0:
                micro[i] = -1
                continue
            micro[i], row[i] = k, q
            free[k][q] -= lengths[i]
            slots[k][q] -= docs[i]
            cells[k] += costs[i]
            count[k] += 1
            placed += 1
            late += sweep
    if placed < len(mine):
        return -1
    return late if how == "tight" or len(mine) < num_micro or min(count) > 0 else -1


def _open_row(length, docs, tight, free, slots, cells, count):
    """``lockstep_kk._open_row`` on one rank's lists: ``(micro-batch, row)`` or ``(-1, -1)``."""
    fitting = []
    for c in range(len(cells)):
        at = reference.fit_row(free[c], length, slots[c], docs)
        if at >= 0:
            fitting.append(((free[c][at], c) if tight else (cells[c], count[c], c), c, at))
    return min(fitting)[1:] if fitting else (-1, -1)


def differencing(values, items, k, equal):
    """``lockstep_kk._difference``: largest differencing of ``items`` (ascending by value)
    into ``k`` lists of items, the heaviest first; with ``equal`` one partial solution per
    run of ``k`` items (the first run padded with empty places), else one per item."""
    partials = []
    if equal:
        pad = -len(items) % k
        padded = [None] * pad + list(items)
        runs = [padded[j : j + k] for j in range(0, len(padded), k)]
    else:
        runs = [[i] + [None] * (k - 1) for i in items]
    for run in runs:
        groups = [(0.0 if i is None else values[i], [] if i is None else [i]) for i in run]
        partials.append(sorted(groups, key=lambda group: -group[0]))
    heap = [(-(p[0][0] - p[-1][0]), j, j) for j, p in enumerate(partials)]
    heapq.heapify(heap)
    tag = len(partials)
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        merged = [
            (
                partials[a][g][0] + partials[b][k - 1 - g][0],
                partials[a][g][1] + partials[b][k - 1 - g][1],
            )
            for g in range(k)
        ]
        partials[a] = sorted(merged, key=lambda group: -group[0])
        heapq.heappush(heap, (-(partials[a][0][0] - partials[a][-1][0]), tag, a))
        tag += 1
    return [members for _, members in partials[heap[0][2]]] if partials else []


def ranked_pack(lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs):
    """``lockstep_ranked.ranked_cells``: the rank kernel's LPT (``reference.pack``, even
    micro-batches first, not refined) with every rank's micro-batches by descending cost
    (ties: the lower index first), as ``(free, slots, rank, micro, row, cells)`` lists;
    ``None`` where it finds a unit no row or leaves a cell empty although the step has a
    unit for each."""
    w, n = len(speeds), len(lengths)
    placed = reference.pack(
        lengths, costs, speeds, num_micro, rows, row_length, False, docs=docs, row_docs=row_docs
    )
    if placed is None:
        return None
    rank, micro, row = (list(x) for x in placed[:3])
    sums = [[0.0] * num_micro for _ in range(w)]
    count = [[0] * num_micro for _ in range(w)]
    for i in range(n):
        sums[rank[i]][micro[i]] += costs[i]
        count[rank[i]][micro[i]] += 1
    if n >= w * num_micro and min(min(c) for c in count) == 0:
        return None
    return sorted_micro_batches(
        lengths, costs, docs, rows, row_length, row_docs, rank, micro, row, sums
    )


def step(cells, speeds):
    """``lockstep._step``: the sum over micro-batches of the slowest cell's time."""
    total = 0.0
    for k in range(len(cells[0]) if cells else 0):
        high = 0.0
        for r in range(len(cells)):
            high = max(high, cells[r][k] / speeds[r])
        total += high
    return total


def refine(lengths, costs, docs, order, speeds, free, slots, rank, micro, row, cells):
    """``lockstep._refine``: leveling, then relief (mutated in place)."""
    level_steps(lengths, costs, docs, speeds, free, slots, rank, micro, row, cells)
    relieve_columns(
        lengths, costs, docs, order, speeds, free, slots, rank, micro, row, cells,
        max(len(lengths), 8192),
    )  # fmt: skip


def greedy_pack(lengths, costs, docs, speeds, num_micro, rows, row_length, row_docs):
    """The ladder greedy: ``(free, slots, rank, micro, row, cells)`` lists, or ``None`` if a
    unit fits no cell. Each unit, by descending cost, to the cell minimising (rise of its
    micro-batch's maximum, slack left below that maximum, its new time, micro-batch, rank);
    while no more units are left than cells are empty, only empty cells are candidates."""
    w, n = len(speeds), len(lengths)
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    count = [[0] * num_micro for _ in range(w)]
    cells = [[0.0] * num_micro for _ in range(w)]
    top = [0.0] * num_micro
    rank, micro, row = [-1] * n, [-1] * n, [-1] * n
    empty = w * num_micro
    for t, i in enumerate(reference.descending_order(np.asarray(costs))):
        forced = empty > 0 and n - t <= empty
        candidates = []
        for k in range(num_micro):
            for r in range(w):
                if forced and count[r][k] > 0:
                    continue
                q = reference.fit_row(free[r][k], lengths[i], slots[r][k], docs[i])
                if q < 0:
                    continue
                time = (cells[r][k] + costs[i]) / speeds[r]
                rise = max(0.0, time - top[k])
                candidates.append((rise, top[k] - time if rise == 0.0 else 0.0, time, k, r, q))
        if not candidates:
            return None
        _, _, time, k, r, q = min(candidates)
        rank[i], micro[i], row[i] = r, k, q
        free[r][k][q] -= lengths[i]
        slots[r][k][q] -= docs[i]
        empty -= count[r][k] == 0
        count[r][k] += 1
        cells[r][k] += costs[i]
        top[k] = max(top[k], time)
    return free, slots, rank, micro, row, cells


def lpt_pack(lengths, costs, docs, order, speeds, num_micro, rows, row_length, row_docs):
    """``lockstep_lpt.lpt_cells``: ``(free, slots, rank, micro, row, cells)`` lists, or
    ``None`` if a unit fits no cell. Each unit, in ``order``, to the cell with a row it fits
    minimising (rise of its micro-batch's maximum, its rank's time after, micro-batch, rank);
    while no more units are left than cells are empty, only empty cells are candidates."""
    w, n = len(speeds), len(lengths)
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    count = [[0] * num_micro for _ in range(w)]
    cells = [[0.0] * num_micro for _ in range(w)]
    sums = [0.0] * w
    top = [0.0] * num_micro
    rank, micro, row = [-1] * n, [-1] * n, [-1] * n
    empty = w * num_micro
    for t, i in enumerate(order):
        forced = empty > 0 and n - t <= empty
        candidates = []
        for k in range(num_micro):
            for r in range(w):
                if forced and count[r][k] > 0:
                    continue
                q = reference.fit_row(free[r][k], lengths[i], slots[r][k], docs[i])
                if q < 0:
                    continue
                rise = max(0.0, (cells[r][k] + costs[i]) / speeds[r] - top[k])
                candidates.append((rise, (sums[r] + costs[i]) / speeds[r], k, r, q))
        if not candidates:
            return None
        _, _, k, r, q = min(candidates)
        rank[i], micro[i], row[i] = r, k, q
        free[r][k][q] -= lengths[i]
        slots[r][k][q] -= docs[i]
        empty -= count[r][k] == 0
        count[r][k] += 1
        cells[r][k] += costs[i]
        sums[r] += costs[i]
        top[k] = max(top[k], cells[r][k] / speeds[r])
    return free, slots, rank, micro, row, cells


def level_steps(lengths, costs, docs, speeds, free, slots, rank, micro, row, cells):
    """``lockstep.level_steps`` on lists (mutated in place): per micro-batch, at most
    ``ranks`` changes, each the best move or trade between the slowest cell and the
    fastest one with a change (the 8 fastest cells in ascending time, ties by rank)."""
    w, n = len(speeds), len(lengths)
    if w < 2 or n == 0:
        return
    num_micro = len(cells[0])
    members = [[[] for _ in range(num_micro)] for _ in range(w)]
    for i in range(n):
        members[rank[i]][micro[i]].append(i)

    def best_change(k, a, b):
        best = cells[a][k] / speeds[a] * (1.0 - 1e-12)
        found = (-1, -1)
        if len(members[a][k]) > 1:
            for i in members[a][k]:
                if reference.fit_row(free[b][k], lengths[i], slots[b][k], docs[i]) >= 0:
                    pair = max(
                        (cells[a][k] - costs[i]) / speeds[a], (cells[b][k] + costs[i]) / speeds[b]
                    )
                    if pair < best:
                        best, found = pair, (i, -1)
        for i in members[a][k]:
            for j in members[b][k]:
                if costs[j] >= costs[i]:
                    continue
                if lengths[j] > free[a][k][row[i]] + lengths[i]:
                    continue
                if lengths[i] > free[b][k][row[j]] + lengths[j]:
                    continue
                if (
                    docs[j] > slots[a][k][row[i]] + docs[i]
                    or docs[i] > slots[b][k][row[j]] + docs[j]
                ):
                    continue
                d = costs[i] - costs[j]
                pair = max((cells[a][k] - d) / speeds[a], (cells[b][k] + d) / speeds[b])
                if pair < best:
                    best, found = pair, (i, j)
        return found

    for k in range(num_micro):
        for _ in range(w):
            times = [cells[r][k] / speeds[r] for r in range(w)]
            a = times.index(max(times))
            change, b = (-1, -1), -1
            fastest = sorted(range(w), key=lambda r: (times[r], r))[:8]
            for b in [times.index(min(times)), *fastest]:
                if times[b] >= times[a]:
                    break
                change = best_change(k, a, b)
                if change[0] >= 0:
                    break
            i, j = change
            if i < 0:
                break
            if j < 0:
                q = reference.fit_row(free[b][k], lengths[i], slots[b][k], docs[i])
                free[a][k][row[i]] += lengths[i]
                slots[a][k][row[i]] += docs[i]
                free[b][k][q] -= lengths[i]
                slots[b][k][q] -= docs[i]
                cells[a][k] -= costs[i]
                cells[b][k] += costs[i]
                place = members[a][k].index(i)
                members[a][k][place] = members[a][k][-1]
                members[a][k].pop()
                members[b][k].append(i)
                rank[i], row[i] = b, q
                continue
            qa, qb = row[i], row[j]
            free[a][k][qa] += lengths[i] - lengths[j]
            free[b][k][qb] += lengths[j] - lengths[i]
            slots[a][k][qa] += docs[i] - docs[j]
            slots[b][k][qb] += docs[j] - docs[i]
            d = costs[i] - costs[j]
            cells[a][k] -= d
            cells[b][k] += d
            members[a][k][members[a][k].index(i)] = j
            members[b][k][members[b][k].index(j)] = i
            rank[i], row[i], rank[j], row[j] = b, qb, a, qa


def slowest(cells, speeds, k):
    """``lockstep_relief._slowest``: micro-batch ``k``'s slowest cell, ``(rank, time, next
    time)``: per speed class (in order of first rank), the cell of the highest (cost, rank);
    the class top of the highest time, ties to the earlier class."""
    classes: dict[float, list[int]] = {}
    for r, s in enumerate(speeds):
        classes.setdefault(s, []).append(r)
    a, high, second = -1, -np.inf, -np.inf
    for ranks in classes.values():
        ladder = sorted(ranks, key=lambda r: (cells[r][k], r))
        r = ladder[-1]
        time = cells[r][k] / speeds[r]
        if time > high:
            second = max(second, high)
            a, high = r, time
        else:
            second = max(second, time)
        if len(ladder) > 1:
            second = max(second, cells[ladder[-2]][k] / speeds[ladder[-2]])
    return a, high, second


def relieve_columns(
    lengths, costs, docs, order, speeds, free, slots, rank, micro, row, cells, budget
):
    """``lockstep_relief.relieve_columns`` on lists (mutated in place): sweeps over the
    micro-batches while one changes and fewer than ``budget`` candidates were looked at;
    each trades a unit of the slowest cell for one of the 64 next-cheaper units in
    ``order`` in another micro-batch, keyed (-gain, slack, time, micro-batch, rank)."""
    w, n = len(speeds), len(lengths)
    num_micro = len(cells[0]) if w else 0
    if w < 2 or num_micro < 2 or n == 0:
        return 0
    units = [[[] for _ in range(num_micro)] for _ in range(w)]
    for i in range(n):
        units[rank[i]][micro[i]].append(i)
    pos = {i: t for t, i in enumerate(order)}
    top = [slowest(cells, speeds, k)[1] for k in range(num_micro)]
    reach = max(
        [0.0] + [top[k] * speeds[r] - cells[r][k] for k in range(num_micro) for r in range(w)]
    )
    trades = looks = 0
    changed = True
    while changed and looks < budget:
        changed = False
        for k in range(num_micro):
            a, high, second = slowest(cells, speeds, k)
            best = None
            for i in units[a][k]:
                qa = row[i]
                for t in range(pos[i] + 1, min(n, pos[i] + 1 + 64)):
                    j = order[t]
                    d = costs[i] - costs[j]
                    if d > reach:
                        break
                    looks += 1
                    kk, b, qb = micro[j], rank[j], row[j]
                    if d <= 0.0 or kk == k:
                        continue
                    time = (cells[b][kk] + d) / speeds[b]
                    gain = high - max(second, (cells[a][k] - d) / speeds[a])
                    if time > top[kk] or (gain == 0.0 and time >= top[kk]):
                        continue
                    if best is not None and gain < best[0][0] * -1:
                        continue
                    if (
                        lengths[j] > free[a][k][qa] + lengths[i]
                        or lengths[i] > free[b][kk][qb] + lengths[j]
                        or docs[j] > slots[a][k][qa] + docs[i]
                        or docs[i] > slots[b][kk][qb] + docs[j]
                    ):
                        continue
                    key = (-gain, top[kk] - time, time, kk, b)
                    if best is None or key < best[0]:
                        best = (key, i, j)
            if best is None:
                continue
            (_, _, _, kk, b), i, j = best
            qa, qb = row[i], row[j]
            d = costs[i] - costs[j]
            cells[a][k] -= d
            cells[b][kk] += d
            free[a][k][qa] += lengths[i] - lengths[j]
            free[b][kk][qb] += lengths[j] - lengths[i]
            slots[a][k][qa] += docs[i] - docs[j]
            slots[b][kk][qb] += docs[j] - docs[i]
            units[a][k][units[a][k].index(i)] = j
            units[b][kk][units[b][kk].index(j)] = i
            rank[i], micro[i], row[i], rank[j], micro[j], row[j] = b, kk, qb, a, k, qa
            top[k] = slowest(cells, speeds, k)[1]
            top[kk] = slowest(cells, speeds, kk)[1]
            trades += 1
            changed = True
    return trades


def sorted_micro_batches(lengths, costs, docs, rows, row_length, row_docs, rank, micro, row, by):
    """``sort_micro_batches``: every rank's micro-batches renumbered by descending ``by``
    (equal values keep their order), then ``(free, slots, rank, micro, row, cells)`` rebuilt."""
    w, num_micro, n = len(by), len(by[0]), len(lengths)
    place = [[0] * num_micro for _ in range(w)]
    for r in range(w):
        for p, k in enumerate(sorted(range(num_micro), key=lambda k: (-by[r][k], k))):
            place[r][k] = p
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    cells = [[0.0] * num_micro for _ in range(w)]
    for i in range(n):
        micro[i] = place[rank[i]][micro[i]]
        free[rank[i]][micro[i]][row[i]] -= lengths[i]
        slots[rank[i]][micro[i]][row[i]] -= docs[i]
        cells[rank[i]][micro[i]] += costs[i]
    return free, slots, rank, micro, row, cells
