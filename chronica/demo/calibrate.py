"""Fit the demo's cost model to measured CPU time, robustly (numpy and chronica only; no torch).

A measurement is one rank's step: its samples, their summed tokens, their summed squared
tokens, and the CPU seconds its forward and backward passes took. ``fit_cost`` fits
``CostModel.fit`` (non-negative least squares) to relative errors, so that a 10 ms step
counts as much as a 100 ms one, and refits without the measurements that other processes
disturbed most (beyond 4 robust standard deviations), at most a quarter of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chronica import CostModel

__all__ = ["calibration_batches", "fit_cost", "predict"]


def predict(cost: CostModel, measurements: np.ndarray) -> np.ndarray:
    """Predicted seconds of measurements ``(n, >=3)``: samples, tokens, squared tokens."""
    m = np.asarray(measurements, dtype=np.float64)
    return cost.a * m[:, 0] + cost.b * m[:, 1] + cost.c * m[:, 2]


def fit_cost(measurements: Any) -> tuple[CostModel, dict[str, float]]:
    """The cost model of ``measurements`` ``(n, 4)`` (samples, tokens, squared tokens,
    seconds) and its quality: ``rms_error`` (relative, over the kept measurements),
    ``r2`` and the number ``kept``."""
    m = np.asarray(measurements, dtype=np.float64).reshape(-1, 4)
    m = m[np.isfinite(m).all(axis=1) & (m[:, 3] > 0)]
    if m.shape[0] < 2:
        raise ValueError(f"{m.shape[0]} usable measurements; the cost fit needs at least 2")
    keep = np.ones(m.shape[0], dtype=bool)
    cost = CostModel.linear()
    for _ in range(2):
        scaled = m[keep] / m[keep, 3:4]  # relative errors: every row's target is 1
        cost = CostModel.fit(scaled[:, 0], scaled[:, 1], scaled[:, 2], scaled[:, 3])
        rel = np.log(m[:, 3] / np.maximum(predict(cost, m), 1e-300))
        centre = np.median(rel)
        spread = 1.4826 * np.median(np.abs(rel - centre))
        limit = max(4.0 * spread, float(np.quantile(np.abs(rel - centre), 0.75)))
        keep = np.abs(rel - centre) <= limit
    error = m[keep, 3] / predict(cost, m[keep]) - 1.0
    seconds = m[keep, 3]
    residual = seconds - predict(cost, m[keep])
    total = float(((seconds - seconds.mean()) ** 2).sum())
    return cost, {
        "rms_error": float(np.sqrt(np.mean(error**2))),
        "r2": float(1.0 - (residual**2).sum() / total) if total > 0 else 1.0,
        "kept": int(keep.sum()),
        "measurements": int(m.shape[0]),
    }


def calibration_batches(
    lengths: Any, local_batch: int, steps: int, seed: int, rank: int
) -> list[np.ndarray]:
    """This rank's local batches for ``steps`` calibration steps: alternately a random batch
    (as torch's sampler draws them) and a batch of similar lengths around a random length
    quantile, so that token counts and squared token counts vary independently enough to
    tell the per-token cost from the per-token-pair (attention) cost."""
    lengths = np.asarray(lengths)
    n = lengths.shape[0]
    rng = np.random.default_rng([seed, 0xCA11, rank])
    by_length = np.argsort(lengths, kind="stable")
    out = []
    for i in range(steps):
        if i % 2 == 0 or n < 2 * local_batch:
            out.append(rng.choice(n, local_batch, replace=False))
        else:
            window = min(n, 4 * local_batch)
            start = int(rng.integers(0, n - window + 1))
            out.append(rng.choice(by_length[start : start + window], local_batch, replace=False))
    return out
