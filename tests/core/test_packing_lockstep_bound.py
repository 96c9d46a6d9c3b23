"""``chronica.core.packing.lockstep_bound.lockstep_floor``: never above the shortest lockstep
step of any plan (every plan of small random steps, tried exhaustively), never below the rules
without a price, and each of its terms on a hand-made step."""

from __future__ import annotations

import numpy as np
import pytest

from chronica.core.packing.lockstep_bound import _idle_floor, lockstep_floor


def _optimum(lengths: np.ndarray, costs: np.ndarray, w: int, cap: int) -> float:
    """The shortest lockstep step of any plan, whatever the number of micro-batches: every
    split of the units into cells of at most ``cap`` tokens, each split's cells grouped by
    descending cost into micro-batch indices of ``w`` (the sum of the groups' maxima is then
    the sum of every ``w``-th costliest cell, which no grouping undercuts: the ``j``-th
    costliest index costs at least the ``(j·w)``-th costliest cell)."""
    n = lengths.shape[0]
    order = np.argsort(-lengths, kind="stable")
    tokens: list[int] = []
    cells: list[float] = []
    best = np.inf

    def place(t: int) -> None:
        nonlocal best
        if t == n:
            best = min(best, sum(sorted(cells, reverse=True)[::w]))
            return
        i = order[t]
        for c in range(len(cells)):
            if tokens[c] + lengths[i] <= cap:
                tokens[c] += int(lengths[i])
                cells[c] += float(costs[i])
                place(t + 1)
                tokens[c] -= int(lengths[i])
                cells[c] -= float(costs[i])
        tokens.append(int(lengths[i]))
        cells.append(float(costs[i]))
        place(t + 1)
        tokens.pop()
        cells.pop()

    place(0)
    return best


def _by_density(lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    return np.argsort(-(costs / lengths), kind="stable")


# "quadratic": a + b·L + L² with b drawn; "fixed": a cost per unit besides its tokens' (a
# unit of no tokens still costs); "random": any cost per token, unrelated to the length.
@pytest.mark.parametrize("cost", ["quadratic", "linear", "fixed", "random"])
@pytest.mark.parametrize("seed", range(5))
def test_the_floor_is_at_most_the_best_plan(cost, seed):
    rng = np.random.default_rng([seed, len(cost)])
    for _ in range(30):
        w, n, cap = int(rng.integers(2, 5)), int(rng.integers(3, 9)), int(rng.integers(6, 21))
        lengths = rng.integers(0 if cost == "fixed" else 1, cap + 1, size=n)
        # Most steps with several units over half the cap, where the idle rule counts.
        long = rng.integers(cap // 2 + 1, cap + 1, size=n)
        lengths = np.where(rng.random(n) < rng.random(), long, lengths).astype(np.int64)
        x = lengths.astype(np.float64)
        costs = {
            "quadratic": float(rng.integers(0, 30)) * x + x**2,
            "linear": x,
            "fixed": 30.0 + x,
            "random": rng.random(n) * 10.0 * x,
        }[cost]
        floor = lockstep_floor(lengths, costs, w, cap)
        assert floor <= _optimum(lengths, costs, w, cap) * (1 + 1e-12)
        if lengths.min() > 0:
            # The idle rule without a price (the rule before prices) never lies above it.
            unpriced = _idle_floor(
                lengths, costs, w, cap, _by_density(lengths, costs), np.array([np.inf])
            )
            assert floor >= unpriced


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
    assert _idle_floor(lengths, costs, 2, 10, _by_density(lengths, costs)) == 112.0
    assert lockstep_floor(lengths, costs, 2, 10) == 112.0


def test_the_floor_prices_the_short_units_that_cells_share():
    # Cap 12, costs L², W = 2: the index holding 9 (81) has one more cell, the 8 (64; no
    # unit fits its 4 tokens of room) or short units only, each alone up to 12·6 = 72 by
    # the cost per token of 6, the rule without a price: idle 9, (206 + 9) / 2 = 107.5.
    # But 6 and 5 together cost only 61: at 16/3 per token a short cell reaches at most
    # 64 plus the short units' cost above that price, E = 36 - 32 = 4: idle 81 - 64 = 17,
    # (206 + 17 - 4) / 2 = 109.5 (every plan: 117).
    lengths = np.array([9, 8, 6, 5], dtype=np.int64)
    costs = lengths.astype(np.float64) ** 2
    by_density = _by_density(lengths, costs)
    assert _idle_floor(lengths, costs, 2, 12, by_density, np.array([np.inf])) == 107.5
    assert _idle_floor(lengths, costs, 2, 12, by_density, np.array([16 / 3])) == pytest.approx(
        109.5
    )
    assert 109.5 - 1e-9 <= lockstep_floor(lengths, costs, 2, 12) <= _optimum(lengths, costs, 2, 12)


def test_a_unit_without_tokens_leaves_the_mean_and_the_costliest():
    # A unit of no tokens may join any cell: only the mean, the costliest unit and the
    # long units' count bound the step.
    lengths = np.array([0, 8, 1], dtype=np.int64)
    costs = np.array([5.0, 8.0, 1.0])
    assert lockstep_floor(lengths, costs, 2, 8) == 8.0
    assert lockstep_floor(np.zeros(0, np.int64), np.zeros(0), 3, 8) == 0.0
