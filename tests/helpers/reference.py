"""Pure numpy / Python references for the numba kernels, written for clarity, not speed."""

from __future__ import annotations

from collections import Counter

import numpy as np

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def permutation(n: int, key: int) -> np.ndarray:
    """Fisher-Yates driven by a SplitMix64 stream, rejecting the top partial range."""
    out = list(range(n))
    state = key
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (1 << 64) - ((1 << 64) % bound)
        while True:
            state = (state + GOLDEN) & MASK
            r = mix64(state)
            if r < limit:
                break
        j = r % bound
        out[i], out[j] = out[j], out[i]
    return np.array(out, dtype=np.int64)


def uniforms(n: int, key: int) -> np.ndarray:
    return np.array([(mix64((key + GOLDEN * (i + 1)) & MASK) >> 11) / 2.0**53 for i in range(n)])


def descending_order(costs: np.ndarray) -> np.ndarray:
    """``chronica.core.kernels.argsort_descending``: descending by the top 32 bits of the
    float64 pattern; ties keep position order."""
    keys = (~np.asarray(costs, dtype=np.float64).view(np.uint64)) >> np.uint64(32)
    return np.argsort(keys, kind="stable")


def smallest(values, count: int, exclude: int) -> list[int]:
    """``chronica.core.kernels.smallest_leaves``: up to ``count`` positions of finite
    ``values`` other than ``exclude``, smallest first (ties: lower position)."""
    ranked = sorted((v, i) for i, v in enumerate(values) if i != exclude and v < np.inf)
    return [i for _, i in ranked[:count]]


def grouped_by_size(costs, stream, key: int, jitter: float, per_step: int, step_order):
    """Guided mode's order: stream sorted by jittered cost, largest first (stable), runs of
    ``per_step`` in ``step_order``, the tail last."""
    keys = costs[stream] * (1.0 + jitter * uniforms(len(stream), key))
    by_size = stream[np.argsort(-keys, kind="stable")]
    full = len(step_order)
    blocks = by_size[: full * per_step].reshape(full, per_step)[step_order].ravel()
    return np.concatenate([blocks, by_size[full * per_step :]])


def _speeds(num_ranks, caps, alpha, beta, n):
    caps = [n // num_ranks] * num_ranks if caps is None else [int(c) for c in caps]
    alpha = [0.0] * num_ranks if alpha is None else [float(a) for a in alpha]
    beta = [1.0] * num_ranks if beta is None else [float(b) for b in beta]
    return caps, alpha, beta


def lpt(costs, num_ranks, caps=None, alpha=None, beta=None) -> list[list[int]]:
    """``chronica.core.kernels.lpt`` over ``descending_order``: each sample, largest first,
    to the rank with room whose predicted time
    ``alpha + beta·load`` is lowest (ties: lower rank); equal counts by default."""
    caps, alpha, beta = _speeds(num_ranks, caps, alpha, beta, len(costs))
    members: list[list[int]] = [[] for _ in range(num_ranks)]
    loads = [0.0] * num_ranks
    for i in descending_order(costs):
        room = [r for r in range(num_ranks) if len(members[r]) < caps[r]]
        r = min((alpha[r] + beta[r] * loads[r], r) for r in room)[1]
        members[r].append(int(i))
        loads[r] += costs[i]
    return members


def _best_trade(costs, members, times, beta, a, candidates):
    best = (times[a] * 1e-9, None)
    for b in candidates:
        gap = times[a] - times[b]
        for ia in members[a]:
            for ib in members[b]:
                d = costs[ia] - costs[ib]
                gain = min(beta[a] * d, gap - beta[b] * d)
                if 0 < d and beta[b] * d < gap and gain > best[0]:
                    best = (gain, (b, ia, ib))
    return best[1]


def refine(costs, members, partners, bound, alpha=None, beta=None) -> None:
    """Best single trade of the rank with the top predicted time, with its lightest partners
    first, then with anyone, until none helps."""
    num_ranks = len(members)
    _, alpha, beta = _speeds(num_ranks, [0] * num_ranks, alpha, beta, 0)
    loads = [float(sum(costs[m])) for m in members]
    while True:
        times = [alpha[r] + beta[r] * loads[r] for r in range(num_ranks)]
        a = int(np.argmax(times))
        if times[a] <= bound * (1 + 1e-9):
            return
        others = [r for r in range(num_ranks) if r != a and members[r]]
        lightest = [r for _, r in sorted((times[r], r) for r in others)]
        best = _best_trade(costs, members, times, beta, a, lightest[:partners])
        if best is None and len(costs) <= 16384:
            best = _best_trade(costs, members, times, beta, a, others)
        if best is None:
            return
        b, ia, ib = best
        members[a][members[a].index(ia)] = ib
        members[b][members[b].index(ib)] = ia
        d = costs[ia] - costs[ib]
        loads[a] -= d
        loads[b] += d


def lower_bound(costs, num_ranks, caps=None, alpha=None, beta=None) -> float:
    """max(all ranks finishing together, the best rank holding the largest sample plus its
    caps - 1 smallest)."""
    caps, alpha, beta = _speeds(num_ranks, caps, alpha, beta, len(costs))
    srt = np.sort(costs)
    busy = [r for r in range(num_ranks) if caps[r] > 0]
    together = (costs.sum() + sum(alpha[r] / beta[r] for r in busy)) / sum(
        1 / beta[r] for r in busy
    )
    heaviest = min(alpha[r] + beta[r] * (srt[-1] + srt[: caps[r] - 1].sum()) for r in busy)
    return max(together, heaviest)


def balance_step(costs, num_ranks, partners=4, caps=None, alpha=None, beta=None):
    """Reference of one step of ``balance_steps``: rank -> ascending positions."""
    members = lpt(costs, num_ranks, caps, alpha, beta)
    bound = lower_bound(costs, num_ranks, caps, alpha, beta)
    refine(costs, members, partners, bound, alpha, beta)
    return [sorted(m) for m in members]


def pool_bins(costs, num_bins: int, key: int = 0, jitter: float = 0.0, rounds: bool = True):
    """Reference of ``chronica.core.pool.lpt_bins``: samples by descending jittered cost,
    each to the lightest bin with room (ties: lower bin); or, with ``rounds``, in rounds of
    ``num_bins`` where the i-th largest goes to the i-th lightest bin (bins by the top 32 bits
    of their load, ties by bin number)."""
    costs = np.asarray(costs, dtype=np.float64)
    keys = costs * (1.0 + jitter * uniforms(len(costs), key))
    order = descending_order(keys)
    k = len(costs) // num_bins
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    loads = np.zeros(num_bins)
    for first in range(0, len(costs), num_bins):
        top = loads.view(np.uint64) >> np.uint64(32)
        lightest = sorted(range(num_bins), key=lambda b: (int(top[b]), b))
        for t, i in enumerate(order[first : first + num_bins]):
            if not rounds:
                room = [b for b in range(num_bins) if len(bins[b]) < k]
                b = min(room, key=lambda b: (loads[b], b))
            else:
                b = lightest[t]
            bins[b].append(int(i))
            loads[b] += costs[i]
    return bins


def fill_slack(costs: np.ndarray, bins: list[list[list[int]]], step_tol: float = 1e-4) -> None:
    """Reference of ``chronica.core.pool.fill_slack`` on nested lists ``bins[step][rank]``."""
    steps, ranks = len(bins), len(bins[0])

    def load(t, r):
        return float(sum(costs[i] for i in bins[t][r]))

    closed = [False] * steps
    for _ in range(4 * steps * min(ranks, 64) + 64):
        loads = [[load(t, r) for r in range(ranks)] for t in range(steps)]
        ratios = [max(row) / np.mean(row) if np.mean(row) > 0 else 1.0 for row in loads]
        open_steps = [t for t in range(steps) if not closed[t] and ratios[t] > 1 + step_tol]
        if not open_steps:
            return
        s = max(open_steps, key=lambda t: (ratios[t], -t))
        top_s, mean_s = max(loads[s]), np.mean(loads[s])
        r = int(np.argmin(loads[s]))
        slack = top_s - loads[s][r]
        best = (top_s * 1e-9, None)
        for t in range(steps):
            if t == s:
                continue
            q = int(np.argmax(loads[t]))
            runner = max([loads[t][p] for p in range(ranks) if p != q] + [0.0])
            ceiling = ranks * (top_s * np.mean(loads[t]) - runner * mean_s) / (runner + top_s)
            limit = min(slack, max(loads[t][q] - runner, ceiling))
            for y in bins[t][q]:
                for x in bins[s][r]:
                    d = costs[y] - costs[x]
                    if best[0] < d <= limit:
                        best = (d, (t, q, y, x))
        if best[1] is None:
            closed[s] = True
            continue
        t, q, y, x = best[1]
        bins[t][q][bins[t][q].index(y)] = x
        bins[s][r][bins[s][r].index(x)] = y


def pool_steps(costs, samples, num_ranks: int, step_order, key=0, jitter=0.0, rounds=True):
    """Reference of ``chronica.core.pool.pool_steps``: ``pool_bins``, bins heaviest first
    ``W`` at a time in ``step_order``, ``fill_slack``, then every step split anew
    (``balance_step``, with ``rounds``) or refined from its bins. Returns ``(steps, loads)``:
    ``steps[s][r]`` rank r's sample numbers (sorted) and ``loads[s][r]`` their cost."""
    costs = np.asarray(costs, dtype=np.float64)
    num_steps = len(step_order)
    bins = pool_bins(costs, num_steps * num_ranks, key, jitter, rounds)
    loads = np.array([sum(costs[i] for i in b) for b in bins])
    grouped = np.argsort(-loads, kind="stable").reshape(num_steps, num_ranks)[step_order]
    nested = [[list(bins[g]) for g in row] for row in grouped]
    fill_slack(costs, nested)
    steps, step_loads = [], []
    for step in nested:
        flat = [i for b in step for i in b]
        local = costs[flat]
        if rounds:
            members = balance_step(local, num_ranks)
        else:
            k = len(step[0])
            members = [list(range(r * k, (r + 1) * k)) for r in range(num_ranks)]
            refine(local, members, 4, lower_bound(local, num_ranks))
        steps.append([sorted(int(samples[flat[p]]) for p in m) for m in members])
        step_loads.append([float(local[m].sum()) for m in members])
    return steps, step_loads


def weighted_line(loads, times, weights, ridge):
    """``chronica.core.controller._weighted_line`` in numpy: ``(alpha, beta)`` or ``None``."""
    sw = weights.sum()
    sl = (weights * loads).sum()
    sll = (weights * loads * loads).sum()
    st = (weights * times).sum()
    slt = (weights * loads * times).sum()
    if sll <= 0 or sw <= 0:
        return None
    lam = ridge * sw
    det = (sw + lam) * sll - sl * sl
    if det > 0:
        alpha = (st * sll - sl * slt) / det
        beta = ((sw + lam) * slt - sl * st) / det
        if alpha >= 0 and beta > 0:
            return float(alpha), float(beta)
    beta = slt / sll
    return (0.0, float(beta)) if beta > 0 else None


def robust_line(loads, times, memory, ridge, rounds):
    """``chronica.core.controller._robust_line`` in numpy: exponentially forgetting weights,
    then Huber re-weighting rounds; ``(alpha, beta)`` or ``None``."""
    weights = memory ** np.arange(len(loads) - 1, -1, -1, dtype=np.float64)
    fit = weighted_line(loads, times, weights, ridge)
    if fit is None:
        return None
    for _ in range(rounds):
        residual = np.abs(times - (fit[0] + fit[1] * loads))
        scale = 1.4826 * np.median(residual)
        if scale <= 0:
            break
        huber = np.minimum(1.0, 2.5 * scale / np.maximum(residual, 1e-300))
        fit = weighted_line(loads, times, weights * huber, ridge) or fit
    return fit


def changed(loads, times, alpha, beta, error):
    """``chronica.core.controller._changed`` in numpy."""
    predicted = alpha + beta * loads
    off = (times - predicted) / np.maximum(predicted, 1e-300)
    return bool(np.all(off > error) or np.all(off < -error))


def shared_finish(work, cores):
    """``chronica.sim.timing.shared_finish`` for one step, event by event: all ranks start
    together; while n of them still work, each advances at min(1, cores / n)."""
    left = {r: float(w) for r, w in enumerate(work)}
    now, finish = 0.0, {}
    while left:
        rate = min(1.0, cores / len(left))
        rank = min(left, key=lambda r: (left[r], r))
        step = left[rank] / rate
        now += step
        for r in left:
            left[r] -= step * rate
        finish[rank] = now
        del left[rank]
        for r in [r for r, w in left.items() if w <= 1e-12 * max(1.0, now)]:
            finish[r] = now
            del left[r]
    return np.array([finish[r] for r in range(len(work))])


# Packing (``chronica.core.packing``; its kernels in ``chronica.core.packing.kernels``): LPT
# under row capacities (even micro-batches, else best fit), then move/trade refinement.

PACK_REL_TOL = 1e-9  # a move or trade must gain more than this fraction of the top time
PACK_CLOSE_ENOUGH = 1e-7  # refinement stops this close (relative) to the mean time
PACK_WORTH_MORE = 1e-5  # pair trades and the search of every rank only this far above it
PACK_PARTNERS = 4  # the lightest ranks a trade partner is looked for among first
PACK_WIDE_SEARCH_MAX = 16384  # steps up to this many documents search every rank
PACK_WORK_PER_DOCUMENT = 1024  # refinement's work bound: candidates per document ...
PACK_WORK_PER_RANK = 4  # ... plus this many per document and rank ...
PACK_WORK_FLOOR = 1 << 22  # ... and at least this many


def pack_work_budget(n: int, w: int) -> int:
    """``chronica.core.packing.kernels.work_budget``."""
    return max(PACK_WORK_FLOOR, n * (PACK_WORK_PER_DOCUMENT + PACK_WORK_PER_RANK * w))


def pack_trade_work(rank, micro, row, partners, num_mine: int, pairs: bool) -> int:
    """``chronica.core.packing.trades.trade_work``: ``num_mine`` times the documents of the
    ``partners`` ranks, or with ``pairs`` times ``c·(c+1)/2`` summed over their rows."""
    theirs = [(rank[j], micro[j], row[j]) for j in range(len(rank)) if rank[j] in partners]
    if not pairs:
        return num_mine * len(theirs)
    return num_mine * sum(c * (c + 1) // 2 for c in Counter(theirs).values())


def _seq_sum(values) -> float:
    """Left-to-right float sum from 0.0, as a compiled loop adds (not numpy's pairwise)."""
    total = 0.0
    for v in values:
        total += float(v)
    return total


def fit_row(free_rows: list[int], length: int, slots=None, docs: int = 1) -> int:
    """The fullest row that ``length`` tokens and ``docs`` documents fit in (ties: lower
    row), or -1; ``slots`` (documents every row can still take) default unlimited."""
    slots = slots if slots is not None else [docs] * len(free_rows)
    fitting = [(free, k) for k, free in enumerate(free_rows) if free >= length and slots[k] >= docs]
    return min(fitting)[1] if fitting else -1


def fit_micro(
    free: list[list[int]], micro_loads: list[float], length: int, tight: bool, slots=None, docs=1
) -> tuple[int, int]:
    """Even: the cheapest micro-batch with a row ``length`` fits in (ties: lower index) and
    the fullest such row in it. ``tight``: the fullest row of any micro-batch (ties: lower
    micro-batch, then lower row). ``(-1, -1)`` if none."""
    slots = slots if slots is not None else [[docs] * len(rows) for rows in free]
    if tight:
        fitting = [
            (free[m][k], m, k)
            for m in range(len(free))
            for k in range(len(free[m]))
            if free[m][k] >= length and slots[m][k] >= docs
        ]
        return min(fitting)[1:] if fitting else (-1, -1)
    fitting = [
        (micro_loads[m], m)
        for m in range(len(free))
        if fit_row(free[m], length, slots[m], docs) >= 0
    ]
    if not fitting:
        return -1, -1
    m = min(fitting)[1]
    return m, fit_row(free[m], length, slots[m], docs)


def largest_room(free: list[list[int]], slots=None) -> int:
    """The largest free space of a row that can still take a document, -1 if none can."""
    slots = slots if slots is not None else [[1] * len(rows) for rows in free]
    room = [
        f
        for rows, left in zip(free, slots, strict=True)
        for f, s in zip(rows, left, strict=True)
        if s > 0
    ]
    return max(room, default=-1)


def pack_best_trade(
    lengths, costs, docs, speeds, free, slots, rank, micro, row, loads, a, partners, pairs, gain
):
    """``chronica.core.packing.trades.best_trade``: the trade ``(i, j, k)`` (``k`` -1 without a
    second document) of a document ``i`` of rank ``a`` for a cheaper document ``j`` (with
    ``pairs``, maybe with a later document ``k`` of ``j``'s row) of a rank in ``partners``
    that lowers the larger of the two times most, by more than ``gain``; ``None`` if none.
    Scanned ``i`` in position order, then ``j`` in position order (with ``pairs``: row by
    row, ordered by (rank, micro-batch, row), position order within a row) and ``k`` after
    ``j`` in its row; ties keep the first found."""
    n = len(lengths)
    top = loads[a] / speeds[a]
    mine = [i for i in range(n) if rank[i] == a]
    theirs = [j for j in range(n) if rank[j] != a and rank[j] in partners]
    if pairs:
        # Stable by (rank, micro, row): a row's documents are neighbours, in position order.
        theirs.sort(key=lambda j: (rank[j], micro[j], row[j]))
        groups: list[list[int]] = []
        for j in theirs:
            if groups and (rank[j], micro[j], row[j]) == (
                rank[groups[-1][0]],
                micro[groups[-1][0]],
                row[groups[-1][0]],
            ):
                groups[-1].append(j)
            else:
                groups.append([j])
    else:
        groups = [[j] for j in theirs]
    best = None
    for i in mine:
        slot_a = free[a][micro[i]][row[i]] + lengths[i]  # i's row without i
        docs_a = slots[a][micro[i]][row[i]] + docs[i]
        for group in groups:
            b = rank[group[0]]
            slot_b = free[b][micro[group[0]]][row[group[0]]]  # the free space of j's row
            docs_b = slots[b][micro[group[0]]][row[group[0]]]
            for x, j in enumerate(group):
                for k in [-1, *group[x + 1 :]] if pairs else [-1]:
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
                        gain, best = top - new_top, (i, j, k)
    return best


def pack_refine(
    lengths,
    costs,
    docs,
    speeds,
    tight,
    free,
    slots,
    micro_loads,
    room,
    rank,
    micro,
    row,
    loads,
    budget=None,
):
    """``chronica.core.packing.kernels.refine`` on lists (mutated in place): stops once more
    than ``budget`` (default ``pack_work_budget``) candidates were looked at (per iteration
    ``n``, ``W`` per document of the slowest rank, and ``pack_trade_work`` per search)."""
    w, n = len(speeds), len(lengths)
    if w < 2 or n == 0:
        return
    mean = _seq_sum(loads) / _seq_sum(speeds)
    bound = mean * (1.0 + PACK_CLOSE_ENOUGH)
    budget = pack_work_budget(n, w) if budget is None else budget
    work = 0

    def place(i, b):
        m, k = fit_micro(free[b], micro_loads[b], lengths[i], tight, slots[b], docs[i])
        rank[i], micro[i], row[i] = b, m, k
        free[b][m][k] -= lengths[i]
        slots[b][m][k] -= docs[i]
        micro_loads[b][m] += costs[i]

    for _ in range(4 * n + 16):
        times = [loads[r] / speeds[r] for r in range(w)]
        top = max(times)
        a = times.index(top)  # the first slowest rank
        if top <= bound or work > budget:
            return
        mine = [i for i in range(n) if rank[i] == a]
        work += n + len(mine) * w
        # Moves: one document of ``a`` to another rank with a row it fits in.
        gain, best = top * PACK_REL_TOL, None
        for i in mine:
            after_a = (loads[a] - costs[i]) / speeds[a]
            for b in range(w):
                if b != a and room[b] >= lengths[i]:
                    if docs[i] > 1 and fit_micro(
                        free[b], micro_loads[b], lengths[i], tight, slots[b], docs[i]
                    ) == (-1, -1):
                        continue
                    new_top = max(after_a, (loads[b] + costs[i]) / speeds[b])
                    if top - new_top > gain:
                        gain, best = top - new_top, (i, b)
        if best is not None:
            i, b = best
            free[a][micro[i]][row[i]] += lengths[i]
            slots[a][micro[i]][row[i]] += docs[i]
            micro_loads[a][micro[i]] -= costs[i]
            place(i, b)
            loads[a] -= costs[i]
            loads[b] += costs[i]
            room[a], room[b] = largest_room(free[a], slots[a]), largest_room(free[b], slots[b])
            continue
        # Trades, each side taking the other's row slot: one for one with the lightest
        # ranks (ties: lower rank); while the top is worth more, one for two of one row
        # with them, then one for one with every rank (more ranks than partners, steps
        # small enough).
        lightest = set(sorted(range(w), key=lambda r: (times[r], r))[:PACK_PARTNERS]) - {a}
        args = (lengths, costs, docs, speeds, free, slots, rank, micro, row, loads, a)
        work += pack_trade_work(rank, micro, row, lightest, len(mine), False)
        trade = pack_best_trade(*args, lightest, False, gain)
        worth = top > mean * (1.0 + PACK_WORTH_MORE)
        if trade is None and worth:
            work += pack_trade_work(rank, micro, row, lightest, len(mine), True)
            trade = pack_best_trade(*args, lightest, True, gain)
        if trade is None and worth and w > PACK_PARTNERS + 1 and n <= PACK_WIDE_SEARCH_MAX:
            everyone = set(range(w)) - {a}
            work += pack_trade_work(rank, micro, row, everyone, len(mine), False)
            trade = pack_best_trade(*args, everyone, False, gain)
        if trade is None:
            return
        i, j, k = trade
        b = rank[j]
        taken = lengths[j] + (lengths[k] if k >= 0 else 0)
        given = costs[j] + (costs[k] if k >= 0 else 0.0)
        counted = docs[j] + (docs[k] if k >= 0 else 0)
        d = costs[i] - given
        free[a][micro[i]][row[i]] += lengths[i] - taken
        free[b][micro[j]][row[j]] += taken - lengths[i]
        slots[a][micro[i]][row[i]] += docs[i] - counted
        slots[b][micro[j]][row[j]] += counted - docs[i]
        micro_loads[a][micro[i]] -= d
        micro_loads[b][micro[j]] += d
        slot = (a, micro[i], row[i])
        rank[i], micro[i], row[i] = b, micro[j], row[j]
        for x in (j, k) if k >= 0 else (j,):
            rank[x], micro[x], row[x] = slot
        loads[a] -= d
        loads[b] += d
        room[a], room[b] = largest_room(free[a], slots[a]), largest_room(free[b], slots[b])


def pack(
    lengths,
    costs,
    speeds,
    num_micro,
    rows,
    row_length,
    refine=True,
    tight=False,
    docs=None,
    row_docs=None,
):
    """Reference of ``chronica.core.packing.kernels.pack_attempt``: ``(rank, micro, row,
    loads)`` lists, or ``None`` if LPT finds a document no rank has a row for
    (``refine=False``: LPT only; ``tight``: every document to the fullest row of its rank it
    fits in; ``docs``: documents per unit, default one; ``row_docs``: the most documents in
    a row, default unlimited)."""
    lengths = [int(x) for x in lengths]
    docs = [1] * len(lengths) if docs is None else [int(d) for d in docs]
    row_docs = sum(docs) + 1 if row_docs is None else row_docs
    costs = [float(c) for c in costs]
    speeds = [float(s) for s in speeds]
    w, n = len(speeds), len(lengths)
    free = [[[row_length] * rows for _ in range(num_micro)] for _ in range(w)]
    slots = [[[row_docs] * rows for _ in range(num_micro)] for _ in range(w)]
    micro_loads = [[0.0] * num_micro for _ in range(w)]
    room = [row_length] * w
    loads = [0.0] * w
    rank, micro, row = [-1] * n, [-1] * n, [-1] * n
    for i in descending_order(np.asarray(costs, dtype=np.float64)):
        i = int(i)
        # The rank with a row it fits in whose time after taking it is lowest (ties: lower).
        fitting = [
            ((loads[r] + costs[i]) / speeds[r], r)
            for r in range(w)
            if room[r] >= lengths[i]
            and fit_micro(free[r], micro_loads[r], lengths[i], tight, slots[r], docs[i])[0] >= 0
        ]
        if not fitting:
            return None
        best = min(fitting)[1]
        m, k = fit_micro(free[best], micro_loads[best], lengths[i], tight, slots[best], docs[i])
        rank[i], micro[i], row[i] = best, m, k
        free[best][m][k] -= lengths[i]
        slots[best][m][k] -= docs[i]
        micro_loads[best][m] += costs[i]
        loads[best] += costs[i]
        room[best] = largest_room(free[best], slots[best])
    if refine:
        pack_refine(
            lengths, costs, docs, speeds, tight, free, slots, micro_loads, room, rank, micro,
            row, loads,
        )  # fmt: skip
    return rank, micro, row, loads


def pack_fits(lengths, costs, speeds, num_micro, rows, row_length) -> bool:
    """Whether ``pack_step`` keeps ``num_micro`` micro-batches: the even or the tight LPT
    places every document (refinement never changes that)."""
    return any(
        pack(lengths, costs, speeds, num_micro, rows, row_length, False, tight) is not None
        for tight in (False, True)
    )


PACK_MICRO_GAIN = 0.01  # free counts: one more micro-batch while it gains this much


def pack_floor(lengths, num_replicas, rows, row_length, speeds=None) -> int:
    """The fewest micro-batches ``pack_step`` tries: the tokens fit them (at least one);
    the speeds do not raise it (the 1% rule adds micro-batches where they matter)."""
    del speeds
    return max(1, -(-int(np.sum(lengths)) // (num_replicas * rows * row_length)))


def pack_step(lengths, costs, num_replicas, rows, row_length, speeds=None, num_micro=None):
    """Reference of ``chronica.core.packing.pack_step``: ``(rank, micro, row, num_micro,
    loads)`` as numpy arrays. A fixed count ``num_micro``: that many micro-batches per rank
    where the documents fit, else the next count at which the even or else the tight LPT
    places every document. Free counts (``num_micro=None``): from ``pack_floor`` up to where
    they fit, then one more while the slowest time is more than 1% above the bound and one
    more lowers it by 1% or more."""
    speed = np.ones(num_replicas) if speeds is None else np.asarray(speeds, dtype=np.float64)
    n = len(lengths)
    m = max(pack_floor(lengths, num_replicas, rows, row_length), num_micro or 1)

    def attempt(count):
        out = pack(lengths, costs, speed, count, rows, row_length)
        if out is None:
            out = pack(lengths, costs, speed, count, rows, row_length, tight=True)
        return out

    while (out := attempt(m)) is None:
        m += 1
    best = (out, m)
    if not num_micro and n:
        costs = np.asarray(costs, dtype=np.float64)
        bound = max(costs.sum() / speed.sum(), costs.max() / speed.max())
        top = float((np.array(out[3]) / speed).max())
        while top > bound * (1 + PACK_MICRO_GAIN) and m < n:
            m += 1
            out = attempt(m)
            if out is None:
                break
            if float((np.array(out[3]) / speed).max()) > top * (1 - PACK_MICRO_GAIN):
                break
            best = (out, m)
            top = float((np.array(out[3]) / speed).max())
    (rank, micro, row, loads), m = best
    as_int = [np.array(x, dtype=np.int64) for x in (rank, micro, row)]
    return (*as_int, m, np.array(loads, dtype=np.float64))


def budget_starts(tokens, budget: int) -> list[int]:
    """Reference of ``chronica.core.packing.epoch.step_starts`` with a budget (less the
    stream's end): a step starts at the first document and wherever the next document would
    take the step over ``budget`` tokens."""
    starts: list[int] = []
    used = 0
    for i, t in enumerate(tokens):
        if not starts or used + int(t) > budget:
            starts.append(i)
            used = 0
        used += int(t)
    return starts
