"""Ladders: the cells of one micro-batch held by ranks of one speed, kept sorted by
(cost, rank), so that the lockstep kernels find the fullest cell under a time, and the
slowest cell of a micro-batch, by bisection instead of a scan of every rank.

A ladder is an ``int64`` array of ranks; rung 0 holds the cheapest cell. When a cell's
cost changes, ``rung`` finds its place before the change, and ``climb`` (it grew) or
``sink`` (it shrank) moves it, the rungs it passes shifting by one as a block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["cell_before", "climb", "rung", "sink", "speed_classes"]


@njit(cache=True)
def speed_classes(speeds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranks grouped by equal speed: every rank's class, each class's ranks in ascending
    order (a ``(classes, largest class)`` table) and each class's size. Classes are numbered
    by their lowest rank.

    Args:
        speeds: ``float64`` relative speed per rank.

    Example::

        >>> level, members, size = speed_classes(np.array([1.0, 2.0, 1.0]))
        >>> level.tolist(), members[0, :2].tolist(), size.tolist()
        ([0, 1, 0], [0, 2], [2, 1])
    """
    w = speeds.shape[0]
    level = np.full(w, -1, np.int64)
    size = np.zeros(w, np.int64)
    classes = 0
    for r in range(w):
        if level[r] >= 0:
            continue
        for x in range(r, w):
            if level[x] < 0 and speeds[x] == speeds[r]:
                level[x] = classes
                size[classes] += 1
        classes += 1
    members = np.empty((classes, size[:classes].max()), np.int64)
    filled = np.zeros(classes, np.int64)
    for r in range(w):
        members[level[r], filled[level[r]]] = r
        filled[level[r]] += 1
    return level, members, size[:classes].copy()


@njit(cache=True)
def rung(cells: np.ndarray, ladder: np.ndarray, size: int, r: int) -> int:
    """Rank ``r``'s place on a ladder sorted by (cost, rank): the first rung not below it
    (bisection).

    Args:
        cells: ``float64`` the cost of every rank's cell of the micro-batch.
        ladder: ``int64`` ranks, sorted by (cost, rank) over their first ``size`` entries.
        size: the ladder's rungs.
        r: a rank on the ladder.

    Example::

        >>> rung(np.array([3.0, 1.0, 2.0]), np.array([1, 2, 0]), 3, 0)
        2
    """
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) // 2
        other = ladder[mid]
        if cells[other] < cells[r] or (cells[other] == cells[r] and other < r):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def climb(cells: np.ndarray, ladder: np.ndarray, size: int, x: int, r: int) -> None:
    """Rank ``r``'s cell, on rung ``x``, grew: the rungs it now passes (bisected) shift
    down one and it takes its (cost, rank) place above them (in place).

    Args:
        cells: ``float64`` the cost of every rank's cell, ``r``'s already grown.
        ladder: ``int64`` ranks, sorted by (cost, rank) but for rank ``r``.
        size: the ladder's rungs.
        x: ``r``'s rung before it grew (``rung``).
        r: the rank whose cell grew.

    Example::

        >>> ladder = np.array([0, 1, 2])
        >>> climb(np.array([5.0, 2.0, 3.0]), ladder, 3, 0, 0)
        >>> ladder.tolist()
        [1, 2, 0]
    """
    lo, hi = x + 1, size
    while lo < hi:
        mid = (lo + hi) // 2
        other = ladder[mid]
        if cells[other] < cells[r] or (cells[other] == cells[r] and other < r):
            lo = mid + 1
        else:
            hi = mid
    ladder[x : lo - 1] = ladder[x + 1 : lo]
    ladder[lo - 1] = r


@njit(cache=True)
def sink(cells: np.ndarray, ladder: np.ndarray, x: int, r: int) -> None:
    """Rank ``r``'s cell, on rung ``x``, shrank: the rungs below it that it now passes
    (bisected) shift up one and it takes its (cost, rank) place below them (in place).

    Args:
        cells: ``float64`` the cost of every rank's cell, ``r``'s already shrunk.
        ladder: ``int64`` ranks, sorted by (cost, rank) but for rank ``r``.
        x: ``r``'s rung before it shrank (``rung``).
        r: the rank whose cell shrank.

    Example::

        >>> ladder = np.array([0, 1, 2])
        >>> sink(np.array([1.0, 2.0, 0.5]), ladder, 2, 2)
        >>> ladder.tolist()
        [2, 0, 1]
    """
    lo = rung(cells, ladder, x, r)
    ladder[lo + 1 : x + 1] = ladder[lo:x].copy()
    ladder[lo] = r


@njit(cache=True)
def cell_before(
    rise: float, slack: float, time: float, k: int, r: int,
    b_rise: float, b_slack: float, b_time: float, b_k: int, b_r: int,
) -> bool:  # fmt: skip
    """The kernels' order of candidate cells: ``(rise, slack, time, k, r)`` before
    ``(b_rise, b_slack, b_time, b_k, b_r)``, compared in that order.

    Args:
        rise: how far the candidate raises its micro-batch's maximum (lower first).
        slack: what it leaves below that maximum (lower first: best fit).
        time: its cell's time after the change.
        k: its micro-batch.
        r: its rank.
        b_rise: the best so far's rise.
        b_slack: the best so far's slack.
        b_time: the best so far's time.
        b_k: the best so far's micro-batch.
        b_r: the best so far's rank.

    Example::

        >>> cell_before(0.0, 1.0, 2.0, 0, 1, 0.0, 2.0, 1.0, 0, 0)
        True
    """
    if rise != b_rise:
        return rise < b_rise
    if slack != b_slack:
        return slack < b_slack
    if time != b_time:
        return time < b_time
    if k != b_k:
        return k < b_k
    return r < b_r
