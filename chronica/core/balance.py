"""Balancing kernels: split each step's samples between ranks, equal counts, minimal max cost.

For one step of ``n = k·W`` samples the problem is cardinality-constrained multiway number
partitioning: give every rank exactly ``k`` samples so that the largest per-rank cost is as
small as possible. The kernel runs two passes:

1. LPT with capacities: samples in descending cost order (ties by position), each to the
   least-loaded rank that still has room (ties by lowest rank). For equal costs this is the
   strided split ``position % W`` of torch's ``DistributedSampler``.
2. Swap refinement: while the most-loaded rank can trade one sample with another rank so
   that the larger of the two new loads falls, make the trade that lowers it most, looking
   first among the ``partners`` least-loaded ranks and then, for steps of at most 16384
   samples, among all ranks. Every trade strictly lowers the sorted load vector, so the
   pass terminates, and it never ends worse than where it started.

The result is deterministic: it depends on the costs and their order only. Within a rank,
samples keep their step order (ascending position).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

__all__ = ["DEFAULT_PARTNERS", "balance_steps"]

DEFAULT_PARTNERS = 4
# Steps up to this many samples search every rank for a trade when the lightest fail.
_WIDE_SEARCH_MAX = 16384
# Trades that gain less than this fraction of the top load are not worth an iteration.
_REL_TOL = 1e-9
# Below this many samples a plan is quicker on one thread than the cost of starting more.
_PARALLEL_MIN_SAMPLES = 1 << 18


@njit(cache=True)
def _radix_argsort(keys: np.ndarray) -> np.ndarray:
    """Stable ascending argsort of 32-bit keys (held in uint64) by LSD radix: linear time,
    the same result on every machine. Bytes equal in every key are skipped."""
    n = keys.shape[0]
    order = np.arange(n)
    if n < 2:
        return order
    same = np.uint64(0xFFFFFFFF)
    for i in range(1, n):
        same &= ~(keys[i] ^ keys[0])
    keys = keys.copy()
    next_keys = np.empty(n, np.uint64)
    next_order = np.empty(n, np.int64)
    counts = np.empty(257, np.int64)
    for shift in range(0, 32, 8):
        if (same >> np.uint64(shift)) & np.uint64(0xFF) == np.uint64(0xFF):
            continue
        counts[:] = 0
        for i in range(n):
            counts[((keys[i] >> np.uint64(shift)) & np.uint64(0xFF)) + 1] += 1
        for d in range(256):
            counts[d + 1] += counts[d]
        for i in range(n):
            digit = (keys[i] >> np.uint64(shift)) & np.uint64(0xFF)
            slot = counts[digit]
            counts[digit] = slot + 1
            next_keys[slot] = keys[i]
            next_order[slot] = order[i]
        keys, next_keys = next_keys, keys
        order, next_order = next_order, order
    return order


@njit(cache=True)
def _sort_key(values: np.ndarray, descending: bool) -> np.ndarray:
    # Non-negative float64 values order like their bit patterns; the top 32 bits keep a
    # relative resolution of 2**-20, and the complement turns ascending into descending.
    bits = values.view(np.uint64)
    if descending:
        bits = ~bits
    return (bits >> np.uint64(32)) & np.uint64(0xFFFFFFFF)


@njit(cache=True)
def _argsort_descending(values: np.ndarray) -> np.ndarray:
    """Positions of ``values`` (>= 0) from largest to smallest; near-equal values (within
    2**-20 relative) keep position order."""
    return _radix_argsort(_sort_key(values, True))


@njit(cache=True)
def _lpt(costs: np.ndarray, order: np.ndarray, members: np.ndarray, loads: np.ndarray) -> None:
    """Fill ``members[r]`` (positions, descending cost) and ``loads`` by capacity-bounded LPT.

    A binary heap holds (load, rank) of the ranks with room left, lightest first, ties by rank.
    """
    num_ranks, k = members.shape
    heap_load = np.zeros(num_ranks)
    heap_rank = np.arange(num_ranks)
    counts = np.zeros(num_ranks, np.int64)
    loads[:] = 0.0
    size = num_ranks
    for t in range(order.shape[0]):
        i = order[t]
        r = heap_rank[0]
        members[r, counts[r]] = i
        counts[r] += 1
        load = heap_load[0] + costs[i]
        loads[r] = load
        if counts[r] == k:
            size -= 1
            load = heap_load[size]
            r = heap_rank[size]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= size:
                break
            right = child + 1
            if right < size and (
                heap_load[right] < heap_load[child]
                or (heap_load[right] == heap_load[child] and heap_rank[right] < heap_rank[child])
            ):
                child = right
            if heap_load[child] < load or (heap_load[child] == load and heap_rank[child] < r):
                heap_load[pos] = heap_load[child]
                heap_rank[pos] = heap_rank[child]
                pos = child
            else:
                break
        heap_load[pos] = load
        heap_rank[pos] = r


@njit(cache=True)
def _sort_row(costs: np.ndarray, row: np.ndarray, descending: bool) -> None:
    """Order positions ``row`` by cost (ties: lower position first), in place."""
    # Insertion sort: rows are short and nearly sorted after one swap.
    sign = -1.0 if descending else 1.0
    for i in range(1, row.shape[0]):
        item = row[i]
        c = sign * costs[item]
        j = i - 1
        while j >= 0 and (
            sign * costs[row[j]] > c or (sign * costs[row[j]] == c and row[j] > item)
        ):
            row[j + 1] = row[j]
            j -= 1
        row[j + 1] = item


@njit(cache=True)
def _lightest(loads: np.ndarray, count: int, exclude: int) -> np.ndarray:
    """Up to ``count`` ranks other than ``exclude``, lightest first (ties: lower rank)."""
    picked = np.full(count, -1, np.int64)
    filled = 0
    for r in range(loads.shape[0]):
        if r == exclude:
            continue
        pos = filled if filled < count else count
        while pos > 0 and (
            loads[r] < loads[picked[pos - 1]]
            or (loads[r] == loads[picked[pos - 1]] and r < picked[pos - 1])
        ):
            if pos < count:
                picked[pos] = picked[pos - 1]
            pos -= 1
        if pos < count:
            picked[pos] = r
            if filled < count:
                filled += 1
    return picked[:filled]


@njit(cache=True)
def _lower_bound(costs: np.ndarray, order: np.ndarray, num_ranks: int) -> float:
    """No equal-count split has a top load below this: the mean load, or the largest sample
    plus the ``k - 1`` smallest ones (``order`` sorts ``costs`` descending)."""
    n = costs.shape[0]
    k = n // num_ranks
    heaviest = costs[order[0]]
    for t in range(n - k + 1, n):
        heaviest += costs[order[t]]
    return max(costs.sum() / num_ranks, heaviest)


@njit(cache=True)
def _best_trade(
    costs: np.ndarray, members: np.ndarray, loads: np.ndarray, a: int, candidates: np.ndarray
) -> tuple[float, int, int, int]:
    """The trade between rank ``a`` and one of ``candidates`` (lightest first, or any order)
    that lowers the larger of the two loads most: (gain, b, i, j), ``b = -1`` if none."""
    k = members.shape[1]
    top = loads[a]
    best_gain = top * _REL_TOL
    best_b, best_i, best_j = -1, -1, -1
    for b in candidates:
        if b == a:
            continue
        gap = top - loads[b]
        if gap * 0.5 <= best_gain:
            continue
        half = gap * 0.5
        j = 0
        for i in range(k):
            ca = costs[members[a, i]]
            target = ca - half
            while j < k and costs[members[b, j]] > target:
                j += 1
            for jj in (j - 1, j):
                if 0 <= jj < k:
                    d = ca - costs[members[b, jj]]
                    if 0.0 < d < gap:
                        gain = min(d, gap - d)
                        if gain > best_gain:
                            best_gain = gain
                            best_b, best_i, best_j = b, i, jj
    return best_gain, best_b, best_i, best_j


@njit(cache=True)
def _refine(
    costs: np.ndarray,
    members: np.ndarray,
    loads: np.ndarray,
    bound: float,
    max_iter: int,
    partners: int,
) -> None:
    num_ranks, k = members.shape
    if num_ranks < 2 or k == 0:
        return
    bound *= 1.0 + _REL_TOL
    everyone = np.arange(num_ranks)
    for _ in range(max_iter):
        a = 0
        for r in range(1, num_ranks):
            if loads[r] > loads[a]:
                a = r
        if loads[a] <= bound:
            return
        _, b, i, j = _best_trade(costs, members, loads, a, _lightest(loads, partners, a))
        if b < 0 and partners < num_ranks - 1 and num_ranks * k <= _WIDE_SEARCH_MAX:
            # Stuck with the lightest ranks: a middle rank may still take a trade. Each wide
            # search costs a pass over the step, so very large steps skip it.
            _, b, i, j = _best_trade(costs, members, loads, a, everyone)
        if b < 0:
            return
        ia = members[a, i]
        ib = members[b, j]
        d = costs[ia] - costs[ib]
        members[a, i] = ib
        members[b, j] = ia
        loads[a] -= d
        loads[b] += d
        _sort_row(costs, members[a], True)
        _sort_row(costs, members[b], True)


@njit(cache=True, nogil=True)
def _balance_step_range(
    costs: np.ndarray,
    step_starts: np.ndarray,
    num_ranks: int,
    use_lpt: bool,
    partners: int,
    first: int,
    stop: int,
    perm_out: np.ndarray,
    loads_out: np.ndarray,
) -> None:
    max_iter = 8 * num_ranks + 64
    for s in range(first, stop):
        p0 = step_starts[s]
        n = step_starts[s + 1] - p0
        k = n // num_ranks
        c = costs[p0 : p0 + n]
        members = np.empty((num_ranks, k), np.int64)
        loads = np.zeros(num_ranks)
        order = _argsort_descending(c)
        if use_lpt:
            _lpt(c, order, members, loads)
        else:
            for r in range(num_ranks):
                for t in range(k):
                    members[r, t] = r * k + t
                    loads[r] += c[r * k + t]
                _sort_row(c, members[r], True)
        _refine(c, members, loads, _lower_bound(c, order, num_ranks), max_iter, partners)
        for r in range(num_ranks):
            row = np.sort(members[r])
            total = 0.0
            for t in range(k):
                perm_out[p0 + r * k + t] = p0 + row[t]
                total += c[row[t]]
            loads_out[s, r] = total


def balance_steps(
    costs: np.ndarray,
    step_starts: np.ndarray,
    num_ranks: int,
    *,
    use_lpt: bool = True,
    partners: int = DEFAULT_PARTNERS,
    threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Balance every step of an epoch; return ``(perm, loads)``.

    ``costs`` are the epoch's sample costs in step order; step ``s`` covers positions
    ``step_starts[s]:step_starts[s+1]``, a multiple of ``num_ranks`` long. Rank ``r``'s ``k``
    samples of step ``s`` are ``perm[start + r*k : start + (r+1)*k]`` (positions, ascending)
    and ``loads[s, r]`` is their total cost. With ``use_lpt=False`` the starting split is the
    given contiguous blocks (rank ``r`` owns ``start + r*k ...``) and only refinement runs.

    Steps are independent, so large epochs are split over ``threads`` worker threads (the
    kernel releases the GIL); the result does not depend on the thread count. The threads
    live only for this call, so a later ``fork()`` inherits none.
    """
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    step_starts = np.ascontiguousarray(step_starts, dtype=np.int64)
    num_steps = step_starts.shape[0] - 1
    perm = np.empty(costs.shape[0], np.int64)
    loads = np.empty((num_steps, num_ranks))
    if threads is None:
        threads = min(os.cpu_count() or 1, 8) if costs.shape[0] >= _PARALLEL_MIN_SAMPLES else 1
    threads = max(1, min(threads, num_steps))
    cuts = [num_steps * t // threads for t in range(threads + 1)]
    args = (costs, step_starts, num_ranks, use_lpt, partners)
    if threads == 1:
        _balance_step_range(*args, 0, num_steps, perm, loads)
        return perm, loads
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="chronica-balance") as pool:
        jobs = [
            pool.submit(_balance_step_range, *args, cuts[t], cuts[t + 1], perm, loads)
            for t in range(threads)
        ]
        for job in jobs:
            job.result()
    return perm, loads
