"""A lower bound of the lockstep step, ``sum_k max_r C[r, k]``, over every plan of a step's
units for ``w`` equal ranks with at most ``cap`` tokens a micro-batch, whatever the number of
micro-batches. ``pack_step`` uses it to skip trying one more micro-batch where that cannot
shorten the step by its 1% (planning time), and the lockstep benchmark to say where its 1.05
target is within reach. Only ``numpy``; no plan is needed.

The bound is the largest of (``T`` the total cost, ``c_1`` the costliest unit):

* the mean ``T / w`` and ``c_1``;
* *halves*: units longer than half the cap never share a micro-batch, so micro-batch *k* of
  the ranks holds at most ``w`` of them; with their costs sorted descending,
  ``b_0 >= b_1 >= ...``, the *j*-th costliest micro-batch index costs at least ``b_{j·w}``
  (``j·w + 1`` of them need ``j + 1`` indices);
* *the wall's column*: the micro-batch index holding ``c_1`` costs ``M >= c_1``, and its
  other ``w - 1`` cells hold at most ``(w-1)·cap`` tokens, so at most ``F``, the cost of the
  units besides ``c_1`` with the highest cost per token up to that many tokens (a fraction of
  the last); the other indices cost at least their mean, so the step is at least
  ``M + (T - M - F) / w >= c_1·(1 - 1/w) + (T - F) / w``;
* *cells that cannot reach their index's maximum*: ``w`` times the step is ``T`` plus every
  cell's idle time ``max_k - C[r, k]``. A cell holding a long unit ``i`` (over half the cap)
  holds besides it units of at most ``R_i = cap - L_i`` tokens in all, a cell without one
  units of at most ``R_0 = cap`` tokens, each at most ``cap / 2``: *short* units either way.
  Short units of at most ``R`` tokens cost at most ``R·d(R)`` (``d(R)``: the highest cost per
  token of a unit of at most ``R`` tokens, ``d(cap / 2)`` for ``R_0``), and, at any price
  ``p >= 0`` per token, at most ``p·R`` plus their cost above ``p`` per token,
  ``sum (c_j - p·L_j)^+``, of which all short units together have ``E(p)``. So a cell costs
  at most ``u(p) + e``, with ``u_i(p) = c_i + R_i·min(p, d(R_i))``,
  ``u_0(p) = cap·min(p, d(cap / 2))`` and the cells' ``e`` summing to at most ``E(p)`` (each
  unit lies in one cell). A cell never costs more than its index's maximum ``t``, so it idles
  at least ``(t - u(p))^+ - e``. The ``q`` indices with the costliest maxima
  (``q = ceil(long units / w)``) have maxima ``t_j >= b_{j·w}``, and their ``q·w`` cells are
  distinct cells: each long unit's ``u_i(p)`` at most once, ``u_0(p)`` any number of times.
  Their idle time is at least ``sum (t - u(p))^+ - E(p)``; matching the largest ``u`` to the
  largest ``t`` minimises the sum (``(x)^+`` is convex, so swapping a crossed pair never
  lowers it), so the step is at least ``(T + that minimum - E(p)) / w``, for every ``p``.
  ``p = inf`` (``E = 0``) lets every cell reach ``R·d(R)`` on its own; a lower price counts
  that the cells share the few dense short units (``_idle_floor`` tries ``_PRICES`` prices,
  then as many near the best).

The last two count cost by tokens, so they hold only where every unit has a token; with a
unit of no tokens the bound is the largest of the first two. Plans with fewer than ``w``
units per index, rows within a micro-batch or a limit of documents per row only have fewer
choices, so the bound holds for them too. ``tests/core/test_packing_lockstep_bound.py``
checks it against every plan of small steps.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lockstep_floor"]

# The idle rule tries this many prices per token, then as many again near the best one.
_PRICES = 16


def lockstep_floor(lengths: np.ndarray, costs: np.ndarray, w: int, cap: int) -> float:
    """The lower bound of the module docstring: no plan of these units for ``w`` ranks of
    speed 1 with at most ``cap`` tokens a micro-batch has a shorter lockstep step.

    Args:
        lengths: ``int64`` tokens per unit, each at most ``cap``.
        costs: ``float64`` predicted cost per unit, ``>= 0``.
        w: the ranks, ``>= 1``.
        cap: tokens a micro-batch holds at most.

    Example::

        >>> lengths = np.array([10, 10, 10, 1, 1])
        >>> lockstep_floor(lengths, lengths.astype(float), 2, 12)  # two indices hold a 10
        20.0
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = np.asarray(costs, dtype=np.float64)
    if not costs.shape[0]:
        return 0.0
    total = float(costs.sum())
    first = int(np.argmax(costs))
    halves = float(np.sort(costs[2 * lengths > cap])[::-1][::w].sum())
    simple = max(total / w, float(costs[first]), halves)
    if int(lengths.min()) < 1:
        return simple
    # Every unit by descending cost per token (ties by index), for this rule and the next.
    by_density = np.argsort(-(costs / lengths), kind="stable")
    dense = by_density[by_density != first]
    room = float((w - 1) * cap)
    taken = np.cumsum(lengths[dense].astype(np.float64))
    whole = int(np.searchsorted(taken, room, side="right"))
    most = float(costs[dense[:whole]].sum())
    if whole < dense.shape[0]:
        left = room - (taken[whole - 1] if whole else 0.0)
        most += costs[dense[whole]] * left / int(lengths[dense[whole]])
    column = float(costs[first]) * (1 - 1 / w) + (total - most) / w
    return max(simple, column, _idle_floor(lengths, costs, w, cap, by_density))


def _idle_floor(
    lengths: np.ndarray,
    costs: np.ndarray,
    w: int,
    cap: int,
    by_density: np.ndarray,
    prices: np.ndarray | None = None,
) -> float:
    # The idle rule (module docstring), ``(T + sum (t - u(p))^+ - E(p)) / w``, at the best of
    # ``prices`` (``inf``: no price, ``E = 0``); by default ``_PRICES`` prices at which the
    # short units' densest tokens fill evenly spaced shares of the costliest indices' room and
    # the highest density (no price), then ``_PRICES`` between the best one's neighbours.
    # ``by_density``: the units by descending cost per token. 0 without long units.
    long = 2 * lengths > cap
    if not long.any():
        return 0.0
    density = costs[by_density] / lengths[by_density]
    # d(R), the highest cost per token of a unit of at most R tokens (0: none): the first
    # unit by density whose length is at most R.
    shortest = np.minimum.accumulate(lengths[by_density])
    limits = np.append(cap - lengths[long], cap // 2)
    first = np.searchsorted(-shortest, -limits, side="left")
    highest = np.where(
        first < density.shape[0], density[np.minimum(first, density.shape[0] - 1)], 0.0
    )
    maxima = np.sort(costs[long])[::-1][::w]
    cells = maxima.shape[0] * w
    wanted = np.repeat(maxima, w)
    # E(p) from the short units' costs and tokens, densest first.
    is_short = ~long[by_density]
    short_density = density[is_short]
    spent = np.concatenate(([0.0], np.cumsum(costs[by_density[is_short]])))
    taken = np.concatenate(([0.0], np.cumsum(lengths[by_density[is_short]].astype(np.float64))))

    def floors(at: np.ndarray) -> np.ndarray:
        reach = costs[long] + limits[:-1] * np.minimum(highest[:-1], at[:, None])
        reach = -np.sort(-reach, axis=1)[:, :cells]
        padded = np.full((at.shape[0], cells), -np.inf)
        padded[:, : reach.shape[1]] = reach
        u = np.maximum(padded, cap * np.minimum(highest[-1], at)[:, None])
        above = np.searchsorted(-short_density, -at, side="left")
        excess = spent[above] - np.where(above > 0, at, 0.0) * taken[above]
        return (float(costs.sum()) + np.maximum(wanted - u, 0.0).sum(axis=1) - excess) / w

    if prices is not None:
        return float(floors(prices).max())
    prices = np.array([density[0]])
    if short_density.shape[0]:
        shares = np.linspace(0.0, min(taken[-1], float(cells) * cap), _PRICES)
        at = np.minimum(np.searchsorted(taken[1:], shares), short_density.shape[0] - 1)
        prices = np.append(short_density[at], density[0])
    tried = floors(prices)
    best = int(np.argmax(tried))
    if prices.shape[0] == 1:
        return float(tried[0])
    low, high = prices[min(best + 1, prices.shape[0] - 1)], prices[max(best - 1, 0)]
    return max(float(tried[best]), float(floors(np.linspace(low, high, _PRICES)).max()))
