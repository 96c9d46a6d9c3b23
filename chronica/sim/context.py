"""The simulator's context-parallel model: steps planned by ``chronica.plan_step`` with
``Packing(context_parallel=g)``, timed with the keys and values a CP group exchanges.

Every step's ``W`` devices form ``W / g`` groups of ``g`` (``g = 1``: chronica's plan of
today, no exchange). A micro-batch's sharded documents make the group exchange their keys
and values in every layer, forward (all-gather) and backward (reduce-scatter of their
gradients): ``passes`` collectives per layer. One collective over a group of ``g`` moving
``B`` bytes in all (every rank's share ``B / g``) takes, by the alpha-beta model of a ring
all-gather (``CommModel.seconds``)::

    t(B, g) = (g - 1) · latency + (g - 1) / g · B / bandwidth        (0 when g = 1 or B = 0)

With ``algorithm="allgather"`` the exchange adds to the micro-batch's compute; with
``"ring"`` (ring attention) it overlaps it, the micro-batch taking the longer of the two.
A device's step is the sum over its micro-batches; the step is its slowest device's::

    micro[r, k] = seconds_per_cost · C[r, k]  (+ or max)  layers · passes · t(B[group(r), k], g)
    step        = max_r sum_k micro[r, k]

``C`` is the plan's predicted cost per device and micro-batch (``StepPlan.micro_costs``), so
the compute figures are the planner's; ``B`` counts ``kv_bytes`` per token per layer of the
group's sharded documents in that micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from chronica.core.cost import as_cost_model
from chronica.core.packing import Packing
from chronica.core.packing.planner import StepPlan, plan_step

__all__ = ["COMM_ALGORITHMS", "CommModel", "ContextResult", "simulate_context", "step_seconds"]

COMM_ALGORITHMS = ("allgather", "ring")


def _finite(name: str, value: float, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name}={value!r} must be a finite number")
    if value < low:
        raise ValueError(f"{name}={value!r} must be >= {low}")
    return float(value)


@dataclass(frozen=True)
class CommModel:
    """The keys and values a context-parallel group exchanges, and what that costs.

    Args:
        latency: seconds per hop of one collective (``>= 0``).
        bandwidth: bytes per second per link (``> 0``).
        kv_bytes: bytes of keys and values per token and layer (``>= 0``; 2 · KV heads ·
            head dim · bytes per value, e.g. 2 · 8 · 128 · 2 = 4096).
        layers: layers per micro-batch, each exchanging once per pass (``>= 1``).
        passes: collectives per layer (2: the forward all-gather and the backward
            reduce-scatter).
        algorithm: ``"allgather"`` (the exchange adds to compute) or ``"ring"`` (overlapped
            with it).

    Example::

        >>> CommModel(latency=1e-5, bandwidth=1e9).seconds(4e6, 4)
        0.00303
    """

    latency: float = 1e-5
    bandwidth: float = 1e11
    kv_bytes: float = 4096.0
    layers: int = 32
    passes: int = 2
    algorithm: str = "allgather"

    def __post_init__(self) -> None:
        _finite("latency", self.latency, 0.0)
        _finite("bandwidth", self.bandwidth, 0.0)
        if self.bandwidth <= 0:
            raise ValueError(f"bandwidth={self.bandwidth!r} must be > 0 (bytes per second)")
        _finite("kv_bytes", self.kv_bytes, 0.0)
        for name in ("layers", "passes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a whole number >= 1")
        if self.algorithm not in COMM_ALGORITHMS:
            raise ValueError(f"algorithm={self.algorithm!r} must be one of {COMM_ALGORITHMS}")

    def seconds(self, total_bytes: float, size: int) -> float:
        """One collective over a group of ``size`` ranks moving ``total_bytes`` in all: the
        ring all-gather's ``(size - 1)`` hops of ``total_bytes / size`` bytes each.

        Args:
            total_bytes: the bytes of the whole gathered buffer (every rank's share summed).
            size: the ranks of the group.

        Example::

            >>> CommModel(latency=0.0, bandwidth=1.0).seconds(8.0, 2), CommModel().seconds(8.0, 1)
            (4.0, 0.0)
        """
        if size <= 1 or total_bytes <= 0:
            return 0.0
        hops = size - 1
        return hops * self.latency + hops / size * total_bytes / self.bandwidth

    def micro_seconds(self, sharded_tokens: np.ndarray, size: int) -> np.ndarray:
        """Seconds of a micro-batch's exchanges, every layer and pass, per group: its
        sharded tokens' keys and values gathered over the group.

        Args:
            sharded_tokens: tokens of sharded documents per (group, micro-batch).
            size: the ranks of a group.

        Example::

            >>> CommModel(latency=0.0, bandwidth=1.0, kv_bytes=1.0, layers=1, passes=1
            ...           ).micro_seconds(np.array([[4.0, 0.0]]), 2).tolist()
            [[2.0, 0.0]]
        """
        tokens = np.asarray(sharded_tokens, dtype=np.float64)
        per = np.vectorize(lambda b: self.seconds(b, size), otypes=[np.float64])
        calls = self.layers * self.passes
        return calls * per(tokens * self.kv_bytes) if tokens.size else tokens

    @classmethod
    def fit(cls, sizes: Iterable[int], total_bytes: Iterable[float], seconds: Iterable[float],
            **fields: object) -> CommModel:  # fmt: skip
        """The latency and bandwidth that fit measured collectives best: least squares of the
        relative error of ``seconds ≈ (g - 1) · latency + (g - 1) / g · bytes / bandwidth``
        (every measurement counts alike, small or large).

        Args:
            sizes: the group size of every measurement.
            total_bytes: the gathered bytes of every measurement.
            seconds: the measured seconds.
            fields: the other fields of the model (``kv_bytes``, ``layers``, ...).

        Example::

            >>> model = CommModel.fit([2, 2, 4], [1e6, 2e6, 1e6], [6e-4, 1.1e-3, 1.05e-3])
            >>> round(model.latency, 6), round(model.bandwidth / 1e9, 3)
            (0.0001, 1.0)
        """
        g = np.asarray(list(sizes), dtype=np.float64)
        b = np.asarray(list(total_bytes), dtype=np.float64)
        t = np.asarray(list(seconds), dtype=np.float64)
        design = np.stack([g - 1, (g - 1) / g * b], axis=1) / t[:, None]
        (latency, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
        if per_byte <= 0:
            raise ValueError("the measurements do not grow with the bytes: no bandwidth fits")
        return cls(latency=max(float(latency), 0.0), bandwidth=1.0 / float(per_byte), **fields)  # type: ignore[arg-type]


def step_seconds(plan: StepPlan, comm: CommModel, seconds_per_cost: float) -> tuple[float, float]:
    """One planned step's time and the part of it its slowest device spends exchanging:
    ``(step seconds, exchange seconds of the slowest device)`` (module docstring).

    Args:
        plan: a step planned by ``plan_step`` (any ``context_parallel``).
        comm: the exchange model.
        seconds_per_cost: compute seconds per unit of predicted cost.

    Example::

        >>> plan = plan_step([64, 8, 8, 8], 2, Packing(max_tokens=64, context_parallel=2,
        ...                  pad_multiple=4), cost="quadratic")
        >>> step_seconds(plan, CommModel(latency=0.0, bandwidth=1.0, kv_bytes=1.0, layers=1,
        ...              passes=1), 1e-3)
        (34.176, 32.0)
    """
    g = plan.context_parallel
    compute = plan.micro_costs * seconds_per_cost
    exchange = np.zeros_like(compute)
    if g > 1 and plan.sharded is not None and plan.sharded.any():
        groups = plan.world_size // g
        tokens = np.zeros((groups, plan.num_micro))
        split = np.flatnonzero(plan.sharded)
        np.add.at(tokens, (plan.rank[split] // g, plan.micro[split]), plan.padded[split])
        exchange = np.repeat(comm.micro_seconds(tokens, g), g, axis=0)
    total = compute + exchange if comm.algorithm == "allgather" else np.maximum(compute, exchange)
    per_device = total.sum(1)
    slowest = int(np.argmax(per_device))
    return float(per_device[slowest]), float(exchange[slowest].sum())


@dataclass(frozen=True)
class ContextResult:
    """The simulated steps of one context-parallel size.

    Args:
        size: ``g``.
        step_seconds: seconds of every step.
        exchange_seconds: the slowest device's exchange seconds of every step.
        balance: the planner's figure of every step, slowest device's cost over the mean.
        sharded: documents sharded in every step.
    """

    size: int
    step_seconds: np.ndarray
    exchange_seconds: np.ndarray
    balance: np.ndarray
    sharded: np.ndarray

    def summary(self) -> dict[str, float]:
        """JSON-ready means (and the worst balance) over the steps."""
        return {
            "context_parallel": self.size,
            "step_s": float(self.step_seconds.mean()),
            "exchange_s": float(self.exchange_seconds.mean()),
            "balance_mean": float(self.balance.mean()),
            "balance_worst": float(self.balance.max()),
            "sharded_per_step": float(self.sharded.mean()),
        }


def simulate_context(
    steps: Iterable[np.ndarray],
    devices: int,
    max_tokens: int,
    sizes: Iterable[int],
    cost: object = (0.0, 24576.0, 1.0),
    comm: CommModel | None = None,
    seconds_per_cost: float = 5e-9,
) -> list[ContextResult]:
    """Plan and time every step for every context-parallel size in ``sizes`` (``1``:
    chronica's plan without context parallelism).

    Args:
        steps: every step's document lengths (each at most ``max_tokens``).
        devices: ``W``, a multiple of every size.
        max_tokens: the cap per device and micro-batch (one row).
        sizes: the context-parallel sizes ``g``.
        cost: the cost model (``chronica.CostModel``, a name or ``(a, b, c)``).
        comm: the exchange model (default ``CommModel()``).
        seconds_per_cost: compute seconds per unit of cost.

    Example::

        >>> steps = [np.array([4096, 64, 64, 64, 64, 64, 64, 64])]
        >>> [round(r.summary()["balance_mean"], 2)
        ...  for r in simulate_context(steps, 4, 4096, [1, 4])]
        [3.66, 1.01]
    """
    model = as_cost_model(cost)
    comm = CommModel() if comm is None else comm
    spc = _finite("seconds_per_cost", seconds_per_cost, 0.0)
    steps = list(steps)
    results = []
    for g in sizes:
        packing = Packing(
            max_tokens=max_tokens, context_parallel=g, pad_multiple=2 * g if g > 1 else 1
        )
        rows = []
        for lengths in steps:
            plan = plan_step(lengths, devices, packing, cost=model)
            loads = plan.rank_costs
            rows.append(
                (*step_seconds(plan, comm, spc), float(loads.max() / loads.mean()),
                 0 if plan.sharded is None else int(plan.sharded.sum()))
            )  # fmt: skip
        table = np.array(rows, dtype=np.float64).reshape(-1, 4)
        results.append(ContextResult(g, table[:, 0], table[:, 1], table[:, 2], table[:, 3]))
    return results
