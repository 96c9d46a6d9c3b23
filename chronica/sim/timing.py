"""The cluster's time model: per-rank compute, the gradient all-reduce, and one step.

A step of synchronous data-parallel training lasts as long as its slowest rank's compute,
plus the all-reduce of the gradients, plus a fixed overhead (optimizer, data loading):

    work[s, r]    = (fixed + seconds_per_cost · load[s, r]) · noise[s, r]
    compute[s, r] = work[s, r] · slowdown[s, r]
    step[s]       = max_r compute[s, r] + allreduce(W) + overhead

``load[s, r]`` is the cost (``chronica.core.cost``) of rank r's samples at step s,
``slowdown`` comes from the speed profile and ``noise`` is lognormal with median 1. With
``cores`` set below W (ranks that share a machine's processors, as when a cluster is
emulated on one host), the ranks' ``work`` runs under processor sharing: while n ranks are
still working each advances at ``min(1, cores / n)``, so a rank's ``work`` ends later the
more ranks work beside it; ``slowdown`` then stretches that finish time (an emulated slow
rank computes, then idles). Everything is vectorised over (steps, ranks) with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chronica.core.checks import is_int

__all__ = [
    "ALGORITHMS",
    "AllReduceModel",
    "ComputeModel",
    "StepEvaluation",
    "evaluate_steps",
    "shared_finish",
]


def _ring_seconds(model: AllReduceModel, world: int) -> float:
    hops = world - 1
    return 2.0 * hops / world * model.grad_bytes / model.bandwidth + 2.0 * hops * model.latency_s


def _flat_seconds(model: AllReduceModel, world: int) -> float:
    return model.latency_s + model.grad_bytes / model.bandwidth


# Seconds of one all-reduce by each algorithm, from the model and the number of ranks.
_SECONDS: dict[str, Callable[[AllReduceModel, int], float]] = {
    "ring": _ring_seconds,
    "flat": _flat_seconds,
}
ALGORITHMS = tuple(_SECONDS)


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
        if self.algorithm not in _SECONDS:
            raise ValueError(f"--allreduce {self.algorithm!r} must be one of {ALGORITHMS}")

    def seconds(self, world: int) -> float:
        """Seconds of one all-reduce over ``world`` ranks."""
        return _SECONDS[self.algorithm](self, world)


@dataclass(frozen=True)
class ComputeModel:
    """How predicted cost becomes seconds on a rank.

    ``seconds_per_cost``: seconds per unit of cost on a rank of slowdown 1; ``fixed_s``:
    compute per step whatever the load (kernel launches, Python), slowed down like the
    rest; ``overhead_s``: per-step time outside compute (optimizer, loading), equal on every
    rank; ``noise``: sigma of the lognormal factor on every (step, rank) compute time;
    ``cores``: processors the ranks share (0: every rank has its own device);
    ``coordinator_s``: processor seconds per step of the dynamic kind's coordinator, a thread
    of rank 0's process: with ``cores`` it shares them with the ranks' work.
    """

    seconds_per_cost: float = 2.5e-5
    fixed_s: float = 0.0
    overhead_s: float = 0.0
    noise: float = 0.0
    cores: int = 0
    coordinator_s: float = 0.0

    def __post_init__(self) -> None:
        _non_negative("--seconds-per-cost", self.seconds_per_cost)
        _non_negative("--fixed", self.fixed_s)
        _non_negative("--overhead", self.overhead_s)
        _non_negative("--noise", self.noise)
        if not is_int(self.cores) or self.cores < 0:
            raise ValueError(f"--cores {self.cores!r} must be an int >= 0 (0: one per rank)")
        _non_negative("--coordinator-cpu", self.coordinator_s)

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
    host_work: float = 0.0,
    loads: np.ndarray | None = None,
) -> StepEvaluation:
    """Evaluate steps laid out as in ``chronica.core.EpochPlan``: rank r's samples at step s
    are ``indices[bounds[s, r] : bounds[s, r + 1]]``. ``slowdown`` and ``noise`` have shape
    ``(steps, W)``. ``host_work``: processor seconds per step of other work on the shared
    ``cores`` (the coordinator), which slows the ranks down but sets no step's end.
    ``loads``: ``(steps, W)`` cost units of every rank's step when it is not the sum of its
    samples' costs (a pipelined replica's makespan, ``chronica.sim.pipeline``).
    Guarantees: ``step_s[s] == compute[s].max() + allreduce_s + compute.overhead_s`` and a
    rank without samples computes only ``fixed_s``."""
    if loads is None:
        per_sample = costs[indices]
        prefix = np.concatenate([[0.0], np.cumsum(per_sample)])
        loads = prefix[bounds[:, 1:]] - prefix[bounds[:, :-1]]
    work = (compute.fixed_s + compute.seconds_per_cost * loads) * noise
    world = work.shape[1]
    if compute.cores and host_work > 0:
        other = np.full((work.shape[0], 1), host_work)
        work = shared_finish(np.hstack([work, other]), compute.cores)[:, :world]
    elif 0 < compute.cores < world:
        work = shared_finish(work, compute.cores)
    seconds = work * slowdown
    step_s = seconds.max(axis=1) + allreduce_s + compute.overhead_s
    real, padded = _padding(indices, bounds, sizes)
    return StepEvaluation(loads, seconds, step_s, real, padded)


def shared_finish(work: np.ndarray, cores: int) -> np.ndarray:
    """When each rank's ``work`` (seconds on a processor of its own; shape ``(steps, W)``)
    ends if all start together and share ``cores`` processors fairly: while n ranks are
    still working each advances at ``min(1, cores / n)``. A rank never ends before its own
    ``work``, and the last one no earlier than ``max(max work, total work / cores)``."""
    world = work.shape[1]
    order = np.argsort(work, axis=1, kind="stable")
    ascending = np.take_along_axis(work, order, axis=1)
    increments = np.diff(ascending, axis=1, prepend=0.0)
    # The k-th rank to finish (k = 0, 1, ...) shares the processors with W - k ranks.
    rates = np.minimum(1.0, cores / (world - np.arange(world)))
    finish = np.cumsum(increments / rates, axis=1)
    out = np.empty_like(work)
    np.put_along_axis(out, order, finish, axis=1)
    return out


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
