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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
from numba import njit

from chronica.core.kernels import (
    descending_keys,
    lpt,
    radix_argsort_into,
    smallest_leaves,
    tree_set,
    winner_tree,
)

__all__ = ["DEFAULT_PARTNERS", "balance_steps"]

DEFAULT_PARTNERS = 4
# Steps up to this many samples search every rank for a trade when the lightest fail.
_WIDE_SEARCH_MAX = 16384
# Trades that gain less than this fraction of the top load are not worth an iteration.
_REL_TOL = 1e-9
# Below this many samples a plan is quicker on one thread than the cost of starting more.
_PARALLEL_MIN_SAMPLES = 1 << 18
# Chunks of steps when progress is reported: fine enough for a progress bar, few enough
# that scheduling them costs nothing next to the kernel.
_PROGRESS_CHUNKS = 100
_NO_INDEX = np.empty(0, np.int64)


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
def _lower_bound(
    costs: np.ndarray, order: np.ndarray, caps: np.ndarray, alpha: np.ndarray, beta: np.ndarray
) -> float:
    """No split with these counts has a top time below this bound: the time at which every
    rank, loaded in proportion to its speed, would finish together; or the best time of a
    rank holding the largest sample plus its ``caps - 1`` smallest ones (``order`` sorts
    ``costs`` descending)."""
    n = costs.shape[0]
    inverse_speed = 0.0
    offset = 0.0
    for r in range(caps.shape[0]):
        if caps[r] > 0:
            inverse_speed += 1.0 / beta[r]
            offset += alpha[r] / beta[r]
    together = (costs.sum() + offset) / inverse_speed
    heaviest = np.inf
    last_cap, last_load = -1, 0.0
    for r in range(caps.shape[0]):
        if caps[r] == 0:
            continue
        if caps[r] != last_cap:
            last_cap = caps[r]
            last_load = costs[order[0]]
            for t in range(n - last_cap + 1, n):
                last_load += costs[order[t]]
        heaviest = min(heaviest, alpha[r] + beta[r] * last_load)
    return max(together, heaviest)


@njit(cache=True)
def _best_trade(
    costs: np.ndarray,
    members: np.ndarray,
    caps: np.ndarray,
    times: np.ndarray,
    beta: np.ndarray,
    a: int,
    candidates: np.ndarray,
) -> tuple[float, int, int, int]:
    """The trade between rank ``a`` and one of ``candidates`` (lightest first, or any order)
    that lowers the larger of the two predicted times most: (gain, b, i, j), ``b = -1`` if
    none. Giving a sample ``d`` cheaper than it takes moves ``a`` by ``-beta[a]·d`` and ``b``
    by ``+beta[b]·d``; the best ``d`` makes them meet."""
    top = times[a]
    best_gain = top * _REL_TOL
    best_b, best_i, best_j = -1, -1, -1
    for b in candidates:
        if b == a:
            continue
        gap = top - times[b]
        meet = gap / (beta[a] + beta[b])
        if beta[a] * meet <= best_gain:
            continue
        j = 0
        for i in range(caps[a]):
            ca = costs[members[a, i]]
            target = ca - meet
            while j < caps[b] and costs[members[b, j]] > target:
                j += 1
            for jj in (j - 1, j):
                if 0 <= jj < caps[b]:
                    d = ca - costs[members[b, jj]]
                    if 0.0 < d and beta[b] * d < gap:
                        gain = min(beta[a] * d, gap - beta[b] * d)
                        if gain > best_gain:
                            best_gain = gain
                            best_b, best_i, best_j = b, i, jj
    return best_gain, best_b, best_i, best_j


@njit(cache=True)
def _refine(
    costs: np.ndarray,
    members: np.ndarray,
    caps: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
    loads: np.ndarray,
    bound: float,
    max_iter: int,
    partners: int,
) -> None:
    num_ranks = members.shape[0]
    if num_ranks < 2 or costs.shape[0] == 0:
        return
    bound *= 1.0 + _REL_TOL
    times = alpha + beta * loads
    everyone = np.arange(num_ranks)
    # Winner trees: the heaviest rank (first of equals) is the smallest of -times; the
    # lightest ranks with samples are the smallest times, ranks without as inf.
    top_value, top_where = winner_tree(-times)
    low_value, low_where = winner_tree(np.where(caps > 0, times, np.inf))
    picked = np.empty(partners, np.int64)
    taken = np.empty(partners + 1, np.int64)
    keys = np.empty(partners + 1)
    for _ in range(max_iter):
        a = top_where[1]
        if times[a] <= bound:
            return
        lightest = smallest_leaves(low_value, low_where, a, picked, taken, keys)
        _, b, i, j = _best_trade(costs, members, caps, times, beta, a, lightest)
        if b < 0 and partners < num_ranks - 1 and costs.shape[0] <= _WIDE_SEARCH_MAX:
            # Stuck with the lightest ranks: a middle rank may still take a trade. Each wide
            # search costs a pass over the step, so very large steps skip it.
            _, b, i, j = _best_trade(costs, members, caps, times, beta, a, everyone)
        if b < 0:
            return
        ia = members[a, i]
        ib = members[b, j]
        d = costs[ia] - costs[ib]
        members[a, i] = ib
        members[b, j] = ia
        loads[a] -= d
        loads[b] += d
        for r in (a, b):
            times[r] = alpha[r] + beta[r] * loads[r]
            tree_set(top_value, top_where, r, -times[r])
            tree_set(low_value, low_where, r, times[r])
        _sort_row(costs, members[a, : caps[a]], True)
        _sort_row(costs, members[b, : caps[b]], True)


@njit(cache=True, nogil=True)
def _balance_step_range(
    costs: np.ndarray,
    index: np.ndarray,
    step_starts: np.ndarray,
    caps: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
    use_lpt: bool,
    partners: int,
    first: int,
    stop: int,
    perm_out: np.ndarray,
    loads_out: np.ndarray,
) -> None:
    """Balance steps ``first .. stop - 1``. Position ``p`` of the epoch costs
    ``costs[index[p]]`` and is written out as ``index[p]`` (``costs[p]`` and ``p`` when
    ``index`` is empty)."""
    num_ranks = caps.shape[1]
    max_iter = 8 * num_ranks + 64
    if stop <= first:
        return
    gather = index.shape[0] > 0
    longest = 0
    for s in range(first, stop):
        longest = max(longest, step_starts[s + 1] - step_starts[s])
    # Buffers for the longest step, reused by every step. Positions within a step fit int32.
    c_buffer = np.empty(longest)
    c_sorted = np.empty(longest)
    keys = np.empty(longest, np.uint32)
    spare_keys = np.empty(longest, np.uint32)
    by_cost = np.empty(longest, np.int32)
    spare = np.empty(longest, np.int32)
    owner = np.empty(longest, np.int32)
    members = np.empty((num_ranks, max(caps[first:stop].max(), 1)), np.int32)
    loads = np.zeros(num_ranks)
    cursor = np.empty(num_ranks, np.int64)
    for s in range(first, stop):
        p0 = step_starts[s]
        n = step_starts[s + 1] - p0
        step_caps = caps[s]
        c = c_buffer[:n]
        if gather:
            for p in range(n):
                c[p] = costs[index[p0 + p]]
        else:
            c[:] = costs[p0 : p0 + n]
        descending_keys(c, keys[:n])
        order = radix_argsort_into(keys[:n], spare_keys[:n], by_cost[:n], spare[:n])
        if use_lpt:
            for t in range(n):
                c_sorted[t] = c[order[t]]
            lpt(c_sorted[:n], order, members, step_caps, alpha, beta, loads)
        else:
            loads[:] = 0.0
            offset = 0
            for r in range(num_ranks):
                for t in range(step_caps[r]):
                    members[r, t] = offset + t
                    loads[r] += c[offset + t]
                offset += step_caps[r]
                _sort_row(c, members[r, : step_caps[r]], True)
        bound = _lower_bound(c, order, step_caps, alpha, beta)
        _refine(c, members, step_caps, alpha, beta, loads, bound, max_iter, partners)
        # Every rank's positions in ascending order, with their costs summed in that order:
        # one pass over the step, by the owner of every position.
        offset = p0
        for r in range(num_ranks):
            for t in range(step_caps[r]):
                owner[members[r, t]] = r
            cursor[r] = offset
            offset += step_caps[r]
            loads_out[s, r] = 0.0
        for p in range(n):
            r = owner[p]
            perm_out[cursor[r]] = index[p0 + p] if gather else p0 + p
            cursor[r] += 1
            loads_out[s, r] += c[p]


def balance_steps(
    costs: np.ndarray,
    step_starts: np.ndarray,
    num_ranks: int,
    *,
    counts: np.ndarray | None = None,
    alpha: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    use_lpt: bool = True,
    partners: int = DEFAULT_PARTNERS,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    index: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Balance every step of an epoch; return ``(perm, loads)``.

    ``costs`` are the epoch's sample costs in step order; step ``s`` covers positions
    ``step_starts[s]:step_starts[s+1]``. Rank ``r`` receives ``counts[s, r]`` of them
    (default: equal counts, the step length divided by ``num_ranks``): its positions
    (ascending) follow those of ranks ``0..r-1`` in ``perm``, and ``loads[s, r]`` is their
    total cost. The split minimises the largest predicted time ``alpha[r] + beta[r]·load``
    (default ``alpha = 0``, ``beta = 1``: the largest load). With ``use_lpt=False`` the
    starting split is the given contiguous blocks and only refinement runs.

    Steps are independent, so large epochs are split over ``threads`` worker threads (the
    kernel releases the GIL); the result does not depend on the thread count. The threads
    live only for this call, so a later ``fork()`` inherits none. ``progress(done, total)``,
    if given, is called (from this thread) as steps are finished; the work is then cut into
    about a hundred chunks, which changes nothing in the result.

    ``index`` (sample numbers in step order): position ``p`` then costs ``costs[index[p]]``
    and the first result is ``index[perm]`` (int64), without the gathered costs ever being
    held whole. Counts that do not add up to the steps, or speeds of the wrong shape or
    value, raise ``ValueError``.

    Args:
        costs: ``float64`` sample costs (``>= 0``), in step order (or indexed by ``index``).
        step_starts: ``int64`` where every step starts, plus the end (one more than steps).
        num_ranks: the ranks ``W`` every step is split between.
        counts: ``(steps, W)`` samples per rank (broadcastable); default equal counts.
        alpha: fixed time per rank (default 0).
        beta: time per unit of load per rank, ``> 0`` (default 1).
        use_lpt: start from LPT (``True``) or from the given contiguous blocks.
        partners: the lightest ranks a trade partner is looked for among first.
        threads: worker threads (default: up to 8 for epochs of 2**18 samples or more).
        progress: ``progress(done, total)`` as steps finish, or ``None``.
        index: sample numbers in step order, or ``None`` (positions are the samples).

    Example::

        >>> perm, loads = balance_steps(np.array([5.0, 1.0, 4.0, 2.0]), np.array([0, 4]), 2)
        >>> perm.tolist(), loads.tolist()
        ([0, 1, 2, 3], [[6.0, 6.0]])
    """
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    if index is None:
        index = _NO_INDEX
        positions = costs.shape[0]
    else:
        index = np.ascontiguousarray(index)
        positions = index.shape[0]
    step_starts = np.ascontiguousarray(step_starts, dtype=np.int64)
    num_steps = step_starts.shape[0] - 1
    lengths = np.diff(step_starts)
    if counts is None:
        counts = np.repeat((lengths // num_ranks)[:, None], num_ranks, axis=1)
    counts = np.ascontiguousarray(np.broadcast_to(counts, (num_steps, num_ranks)), np.int64)
    if (counts < 0).any() or not np.array_equal(counts.sum(axis=1), lengths):
        raise ValueError("counts must be >= 0 and add up to every step's length")
    alpha = np.zeros(num_ranks) if alpha is None else np.ascontiguousarray(alpha, np.float64)
    beta = np.ones(num_ranks) if beta is None else np.ascontiguousarray(beta, np.float64)
    if alpha.shape != (num_ranks,) or beta.shape != (num_ranks,):
        raise ValueError(f"alpha and beta must hold one value per rank ({num_ranks})")
    if not (np.isfinite(alpha).all() and np.isfinite(beta).all() and (beta > 0).all()):
        raise ValueError("alpha must be finite and beta finite and > 0")
    perm = np.empty(positions, np.int64)
    loads = np.empty((num_steps, num_ranks))
    if threads is None:
        threads = min(os.cpu_count() or 1, 8) if positions >= _PARALLEL_MIN_SAMPLES else 1
    threads = max(1, min(threads, num_steps))
    chunks = threads if progress is None else max(threads, min(num_steps, _PROGRESS_CHUNKS))
    cuts = [num_steps * t // chunks for t in range(chunks + 1)]

    def run(first: int, stop: int) -> None:
        _balance_step_range(
            costs,
            index,
            step_starts,
            counts,
            alpha,
            beta,
            use_lpt,
            partners,
            first,
            stop,
            perm,
            loads,
        )

    if threads == 1:
        for t in range(chunks):
            run(cuts[t], cuts[t + 1])
            if progress is not None:
                progress(cuts[t + 1], num_steps)
        return perm, loads
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="chronica-balance") as pool:
        jobs = {pool.submit(run, cuts[t], cuts[t + 1]): t for t in range(chunks)}
        done = 0
        for job in as_completed(jobs):
            job.result()
            t = jobs[job]
            done += cuts[t + 1] - cuts[t]
            if progress is not None:
                progress(done, num_steps)
    return perm, loads
