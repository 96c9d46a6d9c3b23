"""Pool balancing: pack a whole epoch into local batches, then into steps.

Exact mode can only split the global batches it is given; when one sample outweighs a rank's
fair share of its batch, that step is bound to be unbalanced. Pool mode chooses the step
composition too:

1. ``lpt_bins``: the epoch's samples go into ``steps × W`` local batches ("bins") of equal
   count by capacity-bounded LPT, so bins have near-equal cost except where a huge sample
   forces one up.
2. Bins are sorted by cost and grouped ``W`` at a time into steps, so heavy bins share steps.
3. ``fill_slack``: in the worst step (highest max/mean), the lightest bin trades a small
   sample for a larger one from the heaviest bin of another step. The trade moves at most
   the receiving bin's headroom below its step's maximum, so that step's maximum stays and
   its mean rises; and at most what keeps the donor step's new max/mean below the receiving
   step's new one. So no step ends worse than the worst step was, the worst ratio never
   rises, and the epoch's total step time (the sum of step maxima) never grows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.balance import _argsort_descending, _lpt, _sort_row

__all__ = ["fill_slack", "lpt_bins"]

_REL_TOL = 1e-9
# Steps within this of perfect balance are left alone: the gain would not be measurable.
_STEP_TOL = 1e-4


def lpt_bins(costs: np.ndarray, keys: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack ``costs`` into ``num_bins`` bins of equal count by capacity-bounded LPT.

    Samples are taken in descending ``keys`` order (``keys`` may be the costs themselves, or
    costs with jitter), each to the lightest bin with room. Returns ``(members, loads)``:
    ``members[b]`` are bin ``b``'s positions into ``costs`` and ``loads[b]`` their total cost.
    """
    if num_bins < 1 or costs.shape[0] % num_bins:
        raise ValueError(f"{costs.shape[0]} samples do not fill {num_bins} bins equally")
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    members = np.empty((num_bins, costs.shape[0] // num_bins), np.int64)
    loads = np.zeros(num_bins)
    order = _argsort_descending(np.ascontiguousarray(keys, dtype=np.float64))
    caps = np.full(num_bins, members.shape[1], np.int64)
    _lpt(costs[order], order, members, caps, np.zeros(num_bins), np.ones(num_bins), loads)
    return members, loads


@njit(cache=True)
def _step_summary(
    loads: np.ndarray,
    t: int,
    top: np.ndarray,
    arg: np.ndarray,
    runner: np.ndarray,
    mean: np.ndarray,
) -> None:
    """Cache step ``t``'s max, argmax, runner-up load and mean."""
    q = np.argmax(loads[t])
    runner_up = 0.0
    for p in range(loads.shape[1]):
        if p != q and loads[t, p] > runner_up:
            runner_up = loads[t, p]
    top[t] = loads[t, q]
    arg[t] = q
    runner[t] = runner_up
    mean[t] = loads[t].mean()


@njit(cache=True)
def _donor_trade(
    costs: np.ndarray,
    donor: np.ndarray,
    receiver: np.ndarray,
    limit: float,
    t: int,
    best: np.ndarray,
    at: np.ndarray,
) -> None:
    """The largest ``d = c_y - c_x <= limit`` (``y`` from ``donor``, ``x`` from ``receiver``,
    both ascending by cost) if it beats ``best[0]``, or ties it from an earlier step
    ``t`` or sample: recorded as ``best[0] = d`` and ``at = (t, i, j)``."""
    k = donor.shape[0]
    j = 0
    for i in range(k):
        cy = costs[donor[i]]
        while j < k and costs[receiver[j]] < cy - limit:
            j += 1
        if j == k:
            break
        d = cy - costs[receiver[j]]
        if d > best[0] or (d == best[0] and at[0] >= 0 and t < at[0]):
            best[0] = d
            at[0], at[1], at[2] = t, i, j
        if d == limit:  # no later sample of this step can do better or tie earlier
            return


@njit(cache=True)
def _fill_slack_kernel(costs: np.ndarray, members: np.ndarray, loads: np.ndarray, max_iter: int):
    num_steps, num_ranks, k = members.shape
    top = np.empty(num_steps)
    arg = np.empty(num_steps, np.int64)
    runner = np.empty(num_steps)
    mean = np.empty(num_steps)
    for t in range(num_steps):
        for r in range(num_ranks):
            # Rows often arrive largest first: reversed, the insertion sort has little to do.
            row = members[t, r]
            for i in range(k // 2):
                row[i], row[k - 1 - i] = row[k - 1 - i], row[i]
            _sort_row(costs, members[t, r], False)
        _step_summary(loads, t, top, arg, runner, mean)
    closed = np.zeros(num_steps, np.bool_)
    limits = np.empty(num_steps)
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
        widest = -1
        for t in range(num_steps):
            limits[t] = -np.inf
            if t == s:
                continue
            # Up to its lead the donor's ratio falls; beyond it, its new ratio
            # runner / (mean_t - d/W) must stay below the receiver's top / (mean_s + d/W).
            lead = top[t] - runner[t]
            ceiling = num_ranks * (top[s] * mean[t] - runner[t] * mean[s]) / (runner[t] + top[s])
            limits[t] = min(slack, max(lead, ceiling))
            if widest < 0 or limits[t] > limits[widest]:
                widest = t
        # The best trade: the largest d, then the earliest step and sample. The step with the
        # widest limit goes first, so that most others are ruled out by their limit alone.
        best[0] = top[s] * _REL_TOL
        at[0] = -1
        for u in range(-1, num_steps):
            t = widest if u < 0 else u
            if t < 0 or t == s or (u >= 0 and t == widest):
                continue
            # A later step than the best must beat it, an earlier one may tie it.
            if limits[t] < best[0] or (limits[t] == best[0] and t > at[0]):
                continue
            _donor_trade(costs, members[t, arg[t]], members[s, r], limits[t], t, best, at)
        if at[0] < 0:
            closed[s] = True
            continue
        best_t, best_i, best_j = at[0], at[1], at[2]
        best_d = best[0]
        q = arg[best_t]
        y = members[best_t, q, best_i]
        members[best_t, q, best_i] = members[s, r, best_j]
        members[s, r, best_j] = y
        loads[best_t, q] -= best_d
        loads[s, r] += best_d
        _sort_row(costs, members[best_t, q], False)
        _sort_row(costs, members[s, r], False)
        _step_summary(loads, best_t, top, arg, runner, mean)
        _step_summary(loads, s, top, arg, runner, mean)


def fill_slack(costs: np.ndarray, members: np.ndarray, loads: np.ndarray) -> None:
    """Move work into under-filled ranks of unbalanced steps (see the module docstring).

    ``members`` has shape ``(steps, W, k)`` (positions into ``costs``) and ``loads`` shape
    ``(steps, W)``; both are updated in place. Counts per bin never change.
    """
    num_steps, num_ranks = members.shape[:2]
    _fill_slack_kernel(costs, members, loads, 4 * num_steps * min(num_ranks, 64) + 64)
