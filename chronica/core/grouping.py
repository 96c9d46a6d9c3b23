"""Guided mode's step composition: samples of similar cost share a step.

An owner's samples are sorted by cost with seeded multiplicative jitter, largest first, so
that similar samples mix between epochs; consecutive runs of one step's worth become the
steps, taken in the shuffled step order, and the partial tail (if any) stays last. One
fused pass draws the jitter and builds the sort keys, one stable radix sort orders them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from chronica.core.kernels import radix_argsort_into
from chronica.core.rng import uniform_at

__all__ = ["grouped_by_size", "jittered_costs"]


@njit(cache=True)
def jittered_costs(
    costs: np.ndarray, samples: np.ndarray, key: np.uint64, jitter: float, out: np.ndarray
) -> None:
    """``out[p] = costs[samples[p]] * (1 + jitter * u_p)`` with ``u = uniforms(n, key)``.

    Args:
        costs: ``float64`` cost of every sample.
        samples: the samples to draw for (any integer dtype).
        key: the jitter stream's key (``chronica.core.rng.derive_key``).
        jitter: the largest relative jitter (``0``: the costs themselves).
        out: ``float64`` buffer as long as ``samples``.

    Example::

        >>> out = np.empty(2)
        >>> jittered_costs(np.array([2.0, 4.0]), np.array([1, 0]), np.uint64(0), 0.0, out)
        >>> out.tolist()
        [4.0, 2.0]
    """
    for p in range(samples.shape[0]):
        out[p] = costs[samples[p]] * (1.0 + jitter * uniform_at(key, p))


@njit(cache=True)
def _grouped_kernel(
    costs: np.ndarray,
    stream: np.ndarray,
    key: np.uint64,
    jitter: float,
    per_step: int,
    step_order: np.ndarray,
    order: np.ndarray,
    spare: np.ndarray,
) -> np.ndarray:
    n = stream.shape[0]
    values = np.empty(n)
    jittered_costs(costs, stream, key, jitter, values)
    # Costs are >= 0 (never -0.0, no NaN), so they order like their bit patterns; the
    # complement sorts them descending, equal values keeping stream order.
    keys = values.view(np.uint64)
    for p in range(n):
        keys[p] = ~keys[p]
    by_size = radix_argsort_into(keys, np.empty(n, np.uint64), order, spare)
    out = np.empty(n, stream.dtype)
    for b in range(step_order.shape[0]):
        source = step_order[b] * per_step
        for t in range(per_step):
            out[b * per_step + t] = stream[by_size[source + t]]
    for p in range(step_order.shape[0] * per_step, n):
        out[p] = stream[by_size[p]]
    return out


def grouped_by_size(
    costs: np.ndarray,
    stream: np.ndarray,
    key: np.uint64,
    jitter: float,
    per_step: int,
    step_order: np.ndarray,
) -> np.ndarray:
    """``stream`` reordered for guided mode (see the module docstring): sorted by jittered
    cost descending (ties keep stream order), the first ``len(step_order)`` runs of
    ``per_step`` samples taken in ``step_order``, then the rest in sorted order.

    Args:
        costs: ``float64`` cost of every sample (``>= 0``).
        stream: an owner's samples (``int32`` or ``int64``); the result has its dtype.
        key: the jitter stream's key.
        jitter: the largest relative jitter.
        per_step: samples of one step.
        step_order: a permutation of the full steps (``len(stream) // per_step`` at most).

    Example::

        >>> grouped_by_size(np.array([1.0, 5.0, 3.0, 4.0]), np.arange(4), np.uint64(0), 0.0,
        ...                 2, np.array([1, 0])).tolist()
        [2, 0, 1, 3]
    """
    n = stream.shape[0]
    dtype = np.int32 if n < 2**31 else np.int64
    return _grouped_kernel(
        costs,
        stream,
        np.uint64(key),
        float(jitter),
        int(per_step),
        np.ascontiguousarray(step_order, np.int64),
        np.empty(n, dtype),
        np.empty(n, dtype),
    )
