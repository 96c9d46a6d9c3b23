"""The cluster's time model: per-rank compute, the gradient all-reduce, and one step.

A step of synchronous data-parallel training lasts as long as its slowest rank's compute,
plus the all-reduce of the gradients, plus a fixed overhead (optimizer, data loading):

    compute[s, r] = (fixed + seconds_per_cost · load[s, r]) · slowdown[s, r] · noise[s, r]
    step[s]       = max_r compute[s, r] + allreduce(W) + overhead

``load[s, r]`` is the cost (``chronica.core.cost``) of rank r's samples at step s,
``slowdown`` comes from the speed profile and ``noise`` is lognormal with median 1.
Everything is vectorised over (steps, ranks) with numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ALGORITHMS", "AllReduceModel", "ComputeModel", "StepEvaluation", "evaluate_steps"]

ALGORITHMS = ("ring", "flat")


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if value < 0:
        raise ValueError(f"{name}={value!r} must be >= 0")


@dataclass(frozen=True)
class AllReduceModel:
    """Time of one all-reduce of ``grad_bytes`` bytes over W ranks.

    ``ring`` (bandwidth-optimal ring, as NCCL and gloo use for large tensors):
    ``2(W-1)/W · bytes/bandwidth + 2(W-1) · latency``. ``flat``: ``latency +
    bytes/bandwidth`` (a single hop, e.g. a parameter server with ample bandwidth).
    Guarantees: ``seconds(1) == 0`` for ``ring`` (nothing to exchange) and the time never
    decreases with ``grad_bytes``.
    """

    latency_s: float = 5e-6
    bandwidth: float = 12.5e9  # bytes per second (100 Gbit/s)
    grad_bytes: float = 1e8
    algorithm: str = "ring"

    def __post_init__(self) -> None:
        _non_negative("--latency", self.latency_s)
        _non_negative("--grad-bytes", self.grad_bytes)
        _non_negative("--bandwidth", self.bandwidth)
        if self.bandwidth == 0:
            raise ValueError("--bandwidth 0 must be > 0 (bytes per second)")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"--allreduce {self.algorithm!r} must be one of {ALGORITHMS}")

    def seconds(self, world: int) -> float:
        """Seconds of one all-reduce over ``world`` ranks."""
        if self.algorithm == "flat":
            return self.latency_s + self.grad_bytes / self.bandwidth
        hops = world - 1
        return 2.0 * hops / world * self.grad_bytes / self.bandwidth + 2.0 * hops * self.latency_s


@dataclass(frozen=True)
class ComputeModel:
    """How predicted cost becomes seconds on a rank.

    ``seconds_per_cost``: seconds per unit of cost on a rank of slowdown 1; ``fixed_s``:
    compute per step whatever the load (kernel launches, Python), slowed down like the
    rest; ``overhead_s``: per-step time outside compute (optimizer, loading), equal on every
    rank; ``noise``: sigma of the lognormal factor on every (step, rank) compute time.
    """

    seconds_per_cost: float = 2.5e-5
    fixed_s: float = 0.0
    overhead_s: float = 0.0
    noise: float = 0.0

    def __post_init__(self) -> None:
        _non_negative("--seconds-per-cost", self.seconds_per_cost)
        _non_negative("--fixed", self.fixed_s)
        _non_negative("--overhead", self.overhead_s)
        _non_negative("--noise", self.noise)

    def noise_factors(self, seed: int, epoch: int, steps: int, world: int) -> np.ndarray:
        """The ``(steps, W)`` noise of one epoch; the same for every configuration of a run
        (a paired comparison), independent of how ranks are loaded."""
        if self.noise == 0:
            return np.ones((steps, world))
        rng = np.random.default_rng([seed, epoch, 0x4E4F])
        return np.exp(self.noise * rng.standard_normal((steps, world)))


@dataclass(frozen=True)
class StepEvaluation:
    """What a run of consecutive steps cost: per (step, rank) ``loads`` and ``compute``
    seconds, per step ``step_s``, and the tokens of every local batch before and after
    padding to its longest sample (``real_tokens``, ``padded_tokens``)."""

    loads: np.ndarray
    compute: np.ndarray
    step_s: np.ndarray
    real_tokens: float
    padded_tokens: float


def evaluate_steps(
    indices: np.ndarray,
    bounds: np.ndarray,
    costs: np.ndarray,
    sizes: np.ndarray,
    slowdown: np.ndarray,
    noise: np.ndarray,
    compute: ComputeModel,
    allreduce_s: float,
) -> StepEvaluation:
    """Evaluate steps laid out as in ``chronica.core.EpochPlan``: rank r's samples at step s
    are ``indices[bounds[s, r] : bounds[s, r + 1]]``. ``slowdown`` and ``noise`` have shape
    ``(steps, W)``. Guarantees: ``step_s[s] == compute[s].max() + allreduce_s +
    compute.overhead_s`` and a rank without samples computes only ``fixed_s``."""
    per_sample = costs[indices]
    prefix = np.concatenate([[0.0], np.cumsum(per_sample)])
    loads = prefix[bounds[:, 1:]] - prefix[bounds[:, :-1]]
    seconds = (compute.fixed_s + compute.seconds_per_cost * loads) * slowdown * noise
    step_s = seconds.max(axis=1) + allreduce_s + compute.overhead_s
    real, padded = _padding(indices, bounds, sizes)
    return StepEvaluation(loads, seconds, step_s, real, padded)


def _padding(indices: np.ndarray, bounds: np.ndarray, sizes: np.ndarray) -> tuple[float, float]:
    """Tokens of every local batch, and tokens once each is padded to its longest sample."""
    starts = bounds[:, :-1].ravel()
    counts = np.diff(bounds, axis=1).ravel()
    keep = counts > 0
    local = sizes[indices]
    if not keep.any():
        return 0.0, 0.0
    longest = np.maximum.reduceat(local, starts[keep])
    return float(local.sum()), float((longest * counts[keep]).sum())
