"""Pool balancing: pack a whole epoch into local batches, then into steps.

Exact mode can only split the global batches it is given; when one sample outweighs a rank's
fair share of its batch, that step is bound to be unbalanced. Pool mode chooses the step
composition too:

1. ``lpt_bins``: the epoch's samples go into ``steps × W`` local batches ("bins") of equal
   count ``k`` by LPT: samples in descending ``keys`` order (costs with seeded jitter), each
   to the lightest bin with room (ties: lower bin), so bins have near-equal cost except
   where a huge sample forces one up. Above ``ROUNDS_ABOVE_BINS`` bins, where the search
   per sample (a winner tree over the bins) no longer fits in a core's cache, LPT runs in
   ``k`` rounds instead: one sample per bin per round, the round's largest sample to the
   lightest bin, its second largest to the second lightest, and so on (bins ordered by the
   top 32 bits of their load, ties by bin number): one sort of the bin loads and one
   sequential pass per round. Both give every bin ``k`` samples; rounds balance the bins
   less finely (step 4 evens that out) and cost a third as much.
2. Bins are sorted by cost and grouped ``W`` at a time into steps, so heavy bins share steps.
3. ``fill_slack``: in the worst step (highest max/mean), the lightest bin trades a small
   sample for a larger one from the heaviest bin of another step. The trade moves at most
   the receiving bin's headroom below its step's maximum, so that step's maximum stays and
   its mean rises; and at most what keeps the donor step's new max/mean below the receiving
   step's new one. So no step ends worse than the worst step was, the worst ratio never
   rises, and the epoch's total step time (the sum of step maxima) never grows.
4. Every step is split between its ranks by ``chronica.core.balance.balance_steps`` (the
   trades of step 3 leave donor steps uneven): from its bins by swap refinement, or, when
   the bins come from rounds, anew by LPT and refinement as exact mode splits a global
   batch. Steps run on threads; each rank's samples keep the order of the step's bins,
   every bin by ascending cost.

Bins carry their samples' costs beside the sample positions, so steps 3 and 4 read memory a
bin (a step) at a time instead of gathering costs from the whole epoch. The result
depends on the costs, the jitter key and the step order only, not on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.balance import balance_steps
from chronica.core.kernels import descending_keys, lpt, radix_argsort_into
from chronica.core.rng import uniform_at

__all__ = ["ROUNDS_ABOVE_BINS", "fill_slack", "lpt_bins", "pool_steps"]

_REL_TOL = 1e-9
# Steps within this of perfect balance are left alone: the gain would not be measurable.
_STEP_TOL = 1e-4
ROUNDS_ABOVE_BINS = 1 << 15
"""Up to this many bins (local batches of an epoch), LPT goes sample by sample, its winner
tree over the bins small enough to stay in a core's cache, and plans are those of earlier
releases; beyond, LPT runs in rounds (see the module docstring)."""


def _position_type(n: int) -> type:
    """The narrowest integer type that holds positions ``0 .. n - 1``."""
    return np.int32 if n < 2**31 else np.int64


@njit(cache=True)
def _jittered_keys(costs: np.ndarray, key: np.uint64, jitter: float, keys: np.ndarray) -> None:
    """``keys[p]``: the 32-bit descending key of ``costs[p] · (1 + jitter · u_p)``, with
    ``u = uniforms(n, key)`` (``chronica.core.grouping.jittered_costs``' values)."""
    chunk = np.empty(4096)
    for first in range(0, costs.shape[0], chunk.shape[0]):
        part = chunk[: min(chunk.shape[0], costs.shape[0] - first)]
        for p in range(part.shape[0]):
            part[p] = costs[first + p] * (1.0 + jitter * uniform_at(key, first + p))
        descending_keys(part, keys[first : first + part.shape[0]])


@njit(cache=True)
def _lpt_bins_kernel(
    costs: np.ndarray,
    key: np.uint64,
    jitter: float,
    members: np.ndarray,
    member_costs: np.ndarray,
    loads: np.ndarray,
    rounds: bool,
) -> None:
    """LPT (module docstring, step 1): ``members[b, j]`` is the ``j``-th position that bin
    ``b`` receives, ``member_costs`` its cost, ``loads[b]`` the bin's total."""
    n = costs.shape[0]
    num_bins, k = members.shape
    sort_keys = np.empty(n, np.uint32)
    _jittered_keys(costs, key, jitter, sort_keys)
    order = radix_argsort_into(
        sort_keys, np.empty(n, np.uint32), np.empty(n, members.dtype), np.empty(n, members.dtype)
    )
    if not rounds:
        sorted_costs = np.empty(n)
        for t in range(n):
            sorted_costs[t] = costs[order[t]]
        caps = np.full(num_bins, k, np.int64)
        lpt(sorted_costs, order, members, caps, np.zeros(num_bins), np.ones(num_bins), loads)
        for b in range(num_bins):
            for j in range(k):
                member_costs[b, j] = costs[members[b, j]]
        return
    bin_keys = np.empty(num_bins, np.uint32)
    spare_keys = np.empty(num_bins, np.uint32)
    by_load = np.empty(num_bins, np.int64)
    spare = np.empty(num_bins, np.int64)
    loads[:] = 0.0
    bits = loads.view(np.uint64)
    for j in range(k):
        # Loads are >= 0, so they order like their bit patterns; their top 32 bits keep a
        # relative resolution of 2**-20, and the sort is stable: ties go to the lower bin.
        for b in range(num_bins):
            bin_keys[b] = np.uint32(bits[b] >> np.uint64(32))
        lightest = radix_argsort_into(bin_keys, spare_keys, by_load, spare)
        first = j * num_bins
        for i in range(num_bins):
            b = lightest[i]
            p = order[first + i]
            c = costs[p]
            members[b, j] = p
            member_costs[b, j] = c
            loads[b] += c


def lpt_bins(
    costs: np.ndarray,
    num_bins: int,
    key: int | np.uint64 = 0,
    jitter: float = 0.0,
    rounds: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pack ``costs`` (>= 0) into ``num_bins`` bins of equal count by LPT (see the module
    docstring). Samples are taken by descending ``costs[p] · (1 + jitter · u_p)``,
    ``u = chronica.core.rng.uniforms(n, key)`` (seeded jitter, so that similar samples mix
    between epochs), compared by their top 32 bits, ties by position. ``rounds``: LPT in
    rounds (``True``) or sample by sample (``False``); by default in rounds above
    ``ROUNDS_ABOVE_BINS`` bins.

    Returns ``(members, member_costs, loads)``: ``members[b]`` are bin ``b``'s positions into
    ``costs`` in the order it received them (int32 below 2**31 samples, else int64),
    ``member_costs[b]`` their costs and ``loads[b]`` their total.

    Args:
        costs: sample costs (``>= 0``); their count a multiple of ``num_bins``.
        num_bins: the bins, ``>= 1``.
        key: the jitter's key (``chronica.core.rng.derive_key``).
        jitter: the largest relative jitter (``0``: none).
        rounds: LPT in rounds, sample by sample, or ``None`` (by the bin count).

    Example::

        >>> members, _, loads = lpt_bins(np.array([4.0, 3.0, 2.0, 1.0]), 2)
        >>> members.tolist(), loads.tolist()
        ([[0, 3], [1, 2]], [5.0, 5.0])
    """
    n = costs.shape[0]
    if num_bins < 1 or n % num_bins:
        raise ValueError(f"{n} samples do not fill {num_bins} bins equally")
    members = np.empty((num_bins, n // num_bins), _position_type(n))
    member_costs = np.empty(members.shape)
    loads = np.empty(num_bins)
    _lpt_bins_kernel(
        np.ascontiguousarray(costs, dtype=np.float64),
        np.uint64(key),
        float(jitter),
        members,
        member_costs,
        loads,
        num_bins > ROUNDS_ABOVE_BINS if rounds is None else bool(rounds),
    )
    return members, member_costs, loads


@njit(cache=True)
def _reverse(values: np.ndarray) -> None:
    """Reverse ``values`` in place."""
    n = values.shape[0]
    for i in range(n // 2):
        values[i], values[n - 1 - i] = values[n - 1 - i], values[i]


@njit(cache=True)
def _sort_bin(costs: np.ndarray, members: np.ndarray) -> None:
    """Order a bin by ascending cost (ties: lower position first), costs and positions
    together, in place."""
    # Insertion sort: bins are short and nearly sorted (after a trade, or reversed as they
    # come from ``lpt_bins``).
    for i in range(1, costs.shape[0]):
        c, item = costs[i], members[i]
        j = i - 1
        while j >= 0 and (costs[j] > c or (costs[j] == c and members[j] > item)):
            costs[j + 1] = costs[j]
            members[j + 1] = members[j]
            j -= 1
        costs[j + 1] = c
        members[j + 1] = item


@njit(cache=True)
def _step_summary(
    loads: np.ndarray,
    t: int,
    top: np.ndarray,
    arg: np.ndarray,
    runner: np.ndarray,
    mean: np.ndarray,
) -> None:
    """Cache step ``t``'s max, argmax (the first), runner-up load and mean, in one pass."""
    q, top_load, runner_up, total = 0, loads[t, 0], 0.0, 0.0
    for p in range(loads.shape[1]):
        value = loads[t, p]
        total += value
        if value > top_load:
            q, top_load, runner_up = p, value, top_load
        elif p != q and value > runner_up:
            runner_up = value
    top[t] = top_load
    arg[t] = q
    runner[t] = runner_up
    mean[t] = total / loads.shape[1]


@njit(cache=True)
def _donor_trade(
    donor: np.ndarray,
    receiver: np.ndarray,
    limit: float,
    t: int,
    best: np.ndarray,
    at: np.ndarray,
) -> None:
    """The largest ``d = c_y - c_x <= limit`` (``c_y`` from ``donor``, ``c_x`` from
    ``receiver``, both ascending costs) if it beats ``best[0]``, or ties it from an earlier
    step ``t`` or sample: recorded as ``best[0] = d`` and ``at = (t, i, j)``."""
    k = donor.shape[0]
    j = 0
    for i in range(k):
        cy = donor[i]
        while j < k and receiver[j] < cy - limit:
            j += 1
        if j == k:
            break
        d = cy - receiver[j]
        if d > best[0] or (d == best[0] and at[0] >= 0 and t < at[0]):
            best[0] = d
            at[0], at[1], at[2] = t, i, j
        if d == limit:  # no later sample of this step can do better or tie earlier
            return


@njit(cache=True)
def _fill_slack_kernel(
    member_costs: np.ndarray, members: np.ndarray, loads: np.ndarray, max_iter: int
) -> None:
    num_steps, num_ranks, k = members.shape
    top = np.empty(num_steps)
    arg = np.empty(num_steps, np.int64)
    runner = np.empty(num_steps)
    mean = np.empty(num_steps)
    for t in range(num_steps):
        for r in range(num_ranks):
            _reverse(member_costs[t, r])
            _reverse(members[t, r])
            _sort_bin(member_costs[t, r], members[t, r])
        _step_summary(loads, t, top, arg, runner, mean)
    closed = np.zeros(num_steps, np.bool_)
    limits = np.empty(num_steps)
    reach = np.empty(num_steps)
    best = np.empty(1)
    at = np.empty(3, np.int64)
    for _ in range(max_iter):
        s, worst = -1, 1.0 + _STEP_TOL
        for t in range(num_steps):
            if not closed[t] and mean[t] > 0 and top[t] / mean[t] > worst:
                s, worst = t, top[t] / mean[t]
        if s < 0:
            return
        r = int(np.argmin(loads[s]))
        slack = top[s] - loads[s, r]
        smallest = member_costs[s, r, 0]
        widest = -1
        for t in range(num_steps):
            limits[t] = reach[t] = -np.inf
            if t == s:
                continue
            # Up to its lead the donor's ratio falls; beyond it, its new ratio
            # runner / (mean_t - d/W) must stay below the receiver's top / (mean_s + d/W).
            lead = top[t] - runner[t]
            ceiling = num_ranks * (top[s] * mean[t] - runner[t] * mean[s]) / (runner[t] + top[s])
            limits[t] = min(slack, max(lead, ceiling))
            # No trade with step t gains more than its largest sample less the receiver's
            # smallest (the same subtraction as the trade's): a bound that rules out most
            # steps without a look at their samples.
            reach[t] = min(limits[t], member_costs[t, arg[t], k - 1] - smallest)
            if widest < 0 or reach[t] > reach[widest]:
                widest = t
        # The best trade: the largest d, then the earliest step and sample. The step that
        # reaches furthest goes first, so that most others are ruled out by their reach alone.
        best[0] = top[s] * _REL_TOL
        at[0] = -1
        for u in range(-1, num_steps):
            t = widest if u < 0 else u
            if t < 0 or t == s or (u >= 0 and t == widest):
                continue
            # A later step than the best must beat it, an earlier one may tie it.
            if reach[t] < best[0] or (reach[t] == best[0] and t > at[0]):
                continue
            _donor_trade(member_costs[t, arg[t]], member_costs[s, r], limits[t], t, best, at)
        if at[0] < 0:
            closed[s] = True
            continue
        best_t, best_i, best_j = at[0], at[1], at[2]
        best_d = best[0]
        q = arg[best_t]
        cy, y = member_costs[best_t, q, best_i], members[best_t, q, best_i]
        member_costs[best_t, q, best_i] = member_costs[s, r, best_j]
        members[best_t, q, best_i] = members[s, r, best_j]
        member_costs[s, r, best_j], members[s, r, best_j] = cy, y
        loads[best_t, q] -= best_d
        loads[s, r] += best_d
        _sort_bin(member_costs[best_t, q], members[best_t, q])
        _sort_bin(member_costs[s, r], members[s, r])
        _step_summary(loads, best_t, top, arg, runner, mean)
        _step_summary(loads, s, top, arg, runner, mean)


def fill_slack(member_costs: np.ndarray, members: np.ndarray, loads: np.ndarray) -> None:
    """Move work into under-filled ranks of unbalanced steps (see the module docstring).

    ``members`` has shape ``(steps, W, k)`` (sample positions, each bin in the order
    ``lpt_bins`` returns it), ``member_costs`` their costs and ``loads`` shape ``(steps, W)``;
    all are updated in place, every bin left in ascending cost order (ties: lower position).
    Counts per bin never change.

    Args:
        member_costs: ``float64`` ``(steps, W, k)``, the costs of ``members``.
        members: ``(steps, W, k)`` sample positions.
        loads: ``float64`` ``(steps, W)``, every bin's total cost.

    Example: ``pool_steps`` runs it between ``lpt_bins`` and ``balance_steps``.
    """
    num_steps, num_ranks = members.shape[:2]
    if member_costs.shape != members.shape or loads.shape != (num_steps, num_ranks):
        raise ValueError(
            f"member_costs must have members' shape {members.shape} and loads "
            f"{(num_steps, num_ranks)}, got {member_costs.shape} and {loads.shape}"
        )
    _fill_slack_kernel(member_costs, members, loads, 4 * num_steps * min(num_ranks, 64) + 64)


def pool_steps(
    costs: np.ndarray,
    samples: np.ndarray,
    num_ranks: int,
    step_order: np.ndarray,
    key: int | np.uint64 = 0,
    jitter: float = 0.0,
    threads: int | None = None,
    rounds: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pool-balance ``samples`` (costing ``costs``) into ``len(step_order)`` steps of
    ``num_ranks`` equal local batches: steps 1 to 4 of the module docstring. Bins are ranked
    heaviest first, ``W`` at a time, and the ``i``-th step of the result is the
    ``step_order[i]``-th of that ranking (so heavy steps line up across owners that share
    a step order). ``key``, ``jitter`` and ``rounds`` as in ``lpt_bins``, ``threads`` as in
    ``balance_steps``. Returns ``(indices, loads)``: ``indices`` (int64) lists step after
    step, rank after rank, every rank's local batch; ``loads[s, r]`` is its total cost.

    Args:
        costs: every sample's cost (``>= 0``).
        samples: the sample numbers, one per cost.
        num_ranks: ranks ``W`` per step.
        step_order: a permutation of the steps (heaviest first ranking -> result order).
        key: the jitter's key.
        jitter: the largest relative jitter.
        threads: threads of ``balance_steps`` (``None``: its default).
        rounds: LPT in rounds, sample by sample, or ``None`` (by the bin count).

    Example::

        >>> indices, loads = pool_steps(np.array([8.0, 1.0, 1.0, 2.0]), np.arange(4), 2,
        ...                             np.arange(2))
        >>> sorted(indices.tolist()), loads.shape
        ([0, 1, 2, 3], (2, 2))
    """
    if samples.shape != costs.shape:
        raise ValueError(
            f"samples must hold one sample number per cost ({costs.shape[0]}), "
            f"got shape {samples.shape}"
        )
    num_steps = step_order.shape[0]
    if rounds is None:
        rounds = num_steps * num_ranks > ROUNDS_ABOVE_BINS
    members, member_costs, bin_loads = lpt_bins(costs, num_steps * num_ranks, key, jitter, rounds)
    grouped = np.argsort(-bin_loads, kind="stable").reshape(num_steps, num_ranks)[step_order]
    members, member_costs, loads = members[grouped], member_costs[grouped], bin_loads[grouped]
    fill_slack(member_costs, members, loads)
    # Bins from rounds are less even: every step is split anew by LPT, as exact mode splits
    # a global batch; otherwise refinement starts from the step's bins.
    per_step = num_ranks * members.shape[2]
    starts = np.arange(0, members.size + 1, per_step)
    perm, step_loads = balance_steps(
        member_costs.reshape(-1), starts, num_ranks, use_lpt=rounds, threads=threads
    )
    return samples[members.reshape(-1)[perm]], step_loads
