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
  cell's idle time ``max_k - C[r, k]``; a cell holding a long unit ``i`` (over half the cap)
  costs at most ``u_i = c_i + (cap - L_i)·d(cap - L_i)`` (``d(R)``: the highest cost per
  token of a unit of at most ``R`` tokens), a cell without one at most ``u_0 = cap·d(cap /
  2)``. The ``q`` indices with the costliest maxima (``q = ceil(long units / w)``) have
  maxima ``t_j >= b_{j·w}``, and their ``q·w`` cells are distinct cells: each long unit's
  ``u_i`` at most once, ``u_0`` any number of times. Their idle time is at least
  ``sum (t - u)^+`` over the cells, and matching the largest ``u`` to the largest ``t``
  minimises it (``(x)^+`` is convex, so swapping a crossed pair never lowers the sum), so the
  step is at least ``(T + that minimum) / w``.

The last two count cost by tokens, so they hold only where every unit has a token; with a
unit of no tokens the bound is the largest of the first two. Plans with fewer than ``w``
units per index, rows within a micro-batch or a limit of documents per row only have fewer
choices, so the bound holds for them too. ``tests/core/test_packing_lockstep_bound.py``
checks it against every plan of small steps.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lockstep_floor"]


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
    rest = np.delete(np.arange(costs.shape[0]), first)
    dense = rest[np.argsort(-(costs[rest] / lengths[rest]), kind="stable")]
    room = float((w - 1) * cap)
    taken = np.cumsum(lengths[dense].astype(np.float64))
    whole = int(np.searchsorted(taken, room, side="right"))
    most = float(costs[dense[:whole]].sum())
    if whole < dense.shape[0]:
        left = room - (taken[whole - 1] if whole else 0.0)
        most += costs[dense[whole]] * left / int(lengths[dense[whole]])
    column = float(costs[first]) * (1 - 1 / w) + (total - most) / w
    return max(simple, column, _idle_floor(lengths, costs, w, cap))


def _idle_floor(lengths: np.ndarray, costs: np.ndarray, w: int, cap: int) -> float:
    # ``(T + the least idle time of the costliest indices' cells) / w`` (module docstring);
    # 0 without long units.
    total = float(costs.sum())
    long = 2 * lengths > cap
    if not long.any():
        return 0.0
    by_length = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[by_length]
    densest = np.maximum.accumulate(costs[by_length] / sorted_lengths)

    def density(tokens: np.ndarray) -> np.ndarray:
        # The highest cost per token of a unit of at most ``tokens`` tokens (0: none).
        at = np.searchsorted(sorted_lengths, tokens, side="right")
        return np.where(at > 0, densest[np.maximum(at - 1, 0)], 0.0)

    room = cap - lengths[long]
    reach = costs[long] + room * density(room)
    maxima = np.sort(costs[long])[::-1][::w]
    cells = maxima.shape[0] * w
    none = float(cap * density(np.array([cap // 2]))[0])
    best = np.sort(np.concatenate((reach, np.full(cells, none))))[::-1][:cells]
    return (total + float(np.maximum(np.repeat(maxima, w) - best, 0.0).sum())) / w
