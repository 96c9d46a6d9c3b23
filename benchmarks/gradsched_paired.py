"""The auto target's statistics of rounds (``benchmarks.gradsched``): a median's bootstrap
interval, and chronica auto over the best fixed setting as a paired, unbiased figure.

Every round of the auto target runs each variant's block once, so two variants' blocks of
the same round saw the same moment of the machine: their quotient, round by round, cancels
the drift a ratio of two medians keeps. Choosing the best fixed setting on the same rounds
it is then judged on picks the luckiest of several noisy settings (the winner's curse: the
minimum of noisy medians lies below the best's true figure), so each round is judged
against the setting the *other* rounds chose (leave one round out): no round's figure went
into its own choice, and every round is judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["BOOTSTRAP", "interval", "paired_to_best"]

BOOTSTRAP = 4000  # resamples of the measured rounds for a ratio's confidence interval


def interval(ratios: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """95% bootstrap interval of the median of per-round ``ratios`` (rounds resampled with
    replacement; a fixed seed, so the same rounds give the same interval).

    Args:
        ratios: one ratio per round.

    Example::

        >>> interval([1.0, 1.0, 1.0])
        (1.0, 1.0)
    """
    values = np.asarray(ratios, dtype=np.float64)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))
    low, high = np.percentile(np.median(values[picks], axis=1), [2.5, 97.5])
    return float(low), float(high)


def paired_to_best(
    auto: Sequence[float], fixed: Mapping[str, Sequence[float]], ddp: Sequence[float]
) -> dict:
    """Chronica auto's block over the best fixed setting's block of the same round, the
    median over rounds with its 95% bootstrap interval, where the best fixed setting for a
    round is the one with the lowest median ratio to DDP over the *other* rounds.

    Args:
        auto: chronica auto's block (seconds) per round.
        fixed: each fixed setting's block (seconds) per round, DDP's among them under "DDP".
        ddp: DDP's block per round (the reference of the choice).

    Returns ``ratio`` (the median), ``interval``, ``per_round`` (the paired quotients),
    ``picks`` (the setting each round was judged against) and ``pick`` (the most common).

    Example::

        >>> out = paired_to_best([0.9, 0.8], {"DDP": [1.0, 1.0], "s": [0.9, 0.8]}, [1.0, 1.0])
        >>> out["ratio"], out["picks"]
        (1.0, ['s', 's'])
    """
    blocks = {k: np.asarray(v, dtype=np.float64) for k, v in fixed.items()}
    mine, reference = np.asarray(auto, dtype=np.float64), np.asarray(ddp, dtype=np.float64)
    rounds = len(mine)
    if not rounds or any(len(b) != rounds for b in (*blocks.values(), reference)):
        raise ValueError("auto, every fixed setting and ddp need one block per round, >= 1")
    to_ddp = {k: b / reference for k, b in blocks.items()}
    picks, per_round = [], []
    for r in range(rounds):
        others = [i for i in range(rounds) if i != r] or [r]  # one round: judged on itself
        pick = min(to_ddp, key=lambda k: (float(np.median(to_ddp[k][others])), k != "DDP"))
        picks.append(pick)
        per_round.append(float(mine[r] / blocks[pick][r]))
    return {
        "ratio": float(np.median(per_round)),
        "interval": interval(per_round),
        "per_round": per_round,
        "picks": picks,
        "pick": Counter(picks).most_common(1)[0][0],
    }
