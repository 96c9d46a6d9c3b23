"""``chronica.core.packing.lockstep_bound.lockstep_floor``: never above the shortest lockstep
step of any plan (every plan of small steps, tried by brute force), and each of its terms on a
hand-made step."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from chronica.core.packing.lockstep_bound import _idle_floor, lockstep_floor


def _optimum(lengths: np.ndarray, costs: np.ndarray, w: int, cap: int) -> float:
    """The shortest lockstep step of any plan, by trying every (rank, micro-batch) of every
    unit (micro-batch indices up to the unit count cover every plan)."""
    n = lengths.shape[0]
    best = np.inf
    for cells in itertools.product(range(w * n), repeat=n):
        tokens = np.bincount(cells, weights=lengths, minlength=w * n)
        if tokens.max() > cap:
            continue
        cost = np.bincount(cells, weights=costs, minlength=w * n).reshape(n, w)
        best = min(best, cost.max(axis=1).sum())
    return best


@pytest.mark.parametrize(("w", "n"), [(2, 5), (3, 4)])
@pytest.mark.parametrize("seed", range(4))
# 5: most units over half the cap; "fixed": a cost per unit besides its tokens' (a unit of
# no tokens still costs).
@pytest.mark.parametrize(("shortest", "cost"), [(1, "quadratic"), (5, "quadratic"), (0, "fixed")])
def test_the_floor_is_at_most_the_best_plan(w, n, seed, shortest, cost):
    rng = np.random.default_rng(seed)
    cap = 12
    lengths = rng.integers(shortest, cap + 1, size=n).astype(np.int64)
    x = lengths.astype(np.float64)
    costs = 24.0 * x + x**2 if cost == "quadratic" else 30.0 + x
    assert lockstep_floor(lengths, costs, w, cap) <= _optimum(lengths, costs, w, cap) * (1 + 1e-12)


def test_the_floor_counts_the_cap():
    # Three units longer than half the cap on 2 ranks: two micro-batch indices hold them,
    # each costing at least 10, where the mean (32 / 2) alone would allow 16.
    lengths = np.array([10, 10, 10, 1, 1], dtype=np.int64)
    assert lockstep_floor(lengths, lengths.astype(np.float64), 2, 12) == 20.0


def test_the_floor_counts_cells_that_cannot_reach_their_maximum():
    # Cap 10, costs L²; W = 2. The index holding 10 (cost 100) has one other cell: 6 tokens
    # (36) and at most 4 more of units of 3 tokens (9 each), so at most 45 + 3 = 48 by the
    # cost per token: it idles at least 52. (172 + 52) / 2 = 112.
    lengths = np.array([10, 6, 3, 3, 3, 3], dtype=np.int64)
    costs = lengths.astype(np.float64) ** 2
    assert _idle_floor(lengths, costs, 2, 10) == 112.0
    assert lockstep_floor(lengths, costs, 2, 10) == 112.0


def test_a_unit_without_tokens_leaves_the_mean_and_the_costliest():
    # A unit of no tokens may join any cell: only the mean, the costliest unit and the
    # long units' count bound the step.
    lengths = np.array([0, 8, 1], dtype=np.int64)
    costs = np.array([5.0, 8.0, 1.0])
    assert lockstep_floor(lengths, costs, 2, 8) == 8.0
    assert lockstep_floor(np.zeros(0, np.int64), np.zeros(0), 3, 8) == 0.0
