"""The configurations a simulation compares: chronica's real scheduler and two baselines.

``torch``
    torch's ``DistributedSampler``: a fresh random permutation every epoch, padded by
    repeating its start to a multiple of W, rank r taking positions r, r+W, ...; each rank's
    stream cut into local batches of B/W (what a ``DataLoader`` does). The permutation,
    padding and strided split are chronica's own (``Scheduler`` with ``batch_size=None``),
    so its global batches are exactly those that chronica's exact mode balances.
``length-grouped``
    Hugging Face's ``LengthGroupedSampler`` with accelerate's dealing: the same padded
    permutation cut into megabatches of ``min(N // (4k), 50)`` local batches (k = B/W), each
    sorted by size, longest first, the longest sample of the epoch moved to the front; local
    batches of k consecutive samples dealt round-robin to the ranks.
``static``, ``pool``, ``guided``, ``dynamic``
    ``chronica.core.Scheduler`` with ``kind="static"`` (exact), ``kind="static",
    exact=False``, ``kind="guided"`` and ``kind="dynamic"`` (``variable_batch=True`` unless
    told otherwise), plus any ``key=value`` options of ``ScheduleConfig`` / ``ShufflePolicy``.
``packed``
    Exact mode's global batches (sizes are document lengths) packed into token-capped
    micro-batches (``chronica.core.packing``): ``max_tokens=`` is required, ``row_length``,
    ``micro_batches``, ``long_documents`` and ``loss`` are ``Packing``'s. Ranks are charged
    the cost of the pieces they train. ``outliers=true`` plans with
    ``Packing(outliers=OutlierDelay(...))`` (heavy documents wait for a later step of the
    epoch), whose ``threshold``, ``max_delay`` and ``max_queue`` may be given (any of them
    implies ``outliers=true``); the result then reports the documents' delays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from chronica.core.config import ScheduleConfig
from chronica.core.cost import CostModel
from chronica.core.modes import as_mode
from chronica.core.packing import Packing
from chronica.core.packing.outliers import OutlierDelay
from chronica.core.plan import EpochPlan
from chronica.core.scheduler import Scheduler, step_counts
from chronica.core.shuffle import ShufflePolicy

__all__ = ["BASELINES", "CHRONICA", "Assignment", "Strategy", "add_counts", "torch_assignment"]

BASELINES = ("torch", "length-grouped")
# chronica's strategies by name: the plan options each one stands for.
_PLANS: dict[str, dict[str, Any]] = {
    "static": {"kind": "static"},
    "pool": {"kind": "static", "exact": False},
    "guided": {"kind": "guided"},
    "dynamic": {"kind": "dynamic", "variable_batch": True},
    "packed": {"kind": "static"},
}
CHRONICA = tuple(_PLANS)
_PACKING_INT_KEYS = ("max_tokens", "row_length", "micro_batches")
# ``OutlierDelay``'s fields (a ``packed`` strategy's ``outliers``).
_OUTLIER_KEYS = ("threshold", "max_delay", "max_queue")
_INT_KEYS = (
    "window",
    "min_batch",
    "max_batch",
    "block_size",
    *_PACKING_INT_KEYS,
    *_OUTLIER_KEYS[1:],
)
_BOOL_KEYS = ("variable_batch", "drop_last", "pre_shuffle", "outliers")
_FLOAT_KEYS = ("q", "jitter", "threshold")
_PACKING_STR_KEYS = ("long_documents", "loss")
_STR_KEYS = ("shuffle", "partition", *_PACKING_STR_KEYS)
_POLICY_KEYS = ("q", "block_size", "partition", "pre_shuffle")
# Local batches per megabatch, at most (transformers' ``get_length_grouped_indices``).
_MEGABATCH_MULT = 50


@dataclass(frozen=True)
class Assignment:
    """Which samples every rank trains on at every step of one epoch, in ``EpochPlan``'s
    layout: rank r's samples at step s are ``indices[bounds[s, r] : bounds[s, r + 1]]``;
    a packed plan's ``pieces`` (``chronica.core.plan.MicroLayout.pieces``) say which part
    of each document is trained."""

    indices: np.ndarray
    bounds: np.ndarray
    pieces: np.ndarray | None = None

    @classmethod
    def of(cls, plan: EpochPlan) -> Assignment:
        return cls(plan.indices, plan.bounds, None if plan.micro is None else plan.micro.pieces)


@dataclass(frozen=True)
class Strategy:
    """One configuration to simulate: ``name`` (a baseline or a chronica kind) and its
    ``options`` (``key=value`` pairs). Validated on construction: unknown names or keys
    raise ``ValueError`` naming ``--config``. ``label`` is the spec it was parsed from."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        if self.name not in BASELINES + CHRONICA:
            raise ValueError(
                f"--config {self.name!r} is not one of {BASELINES + CHRONICA}; options go "
                f"after commas, e.g. --config dynamic,window=8"
            )
        if self.name in BASELINES and self.options:
            raise ValueError(f"--config {self.name} takes no options")
        if not self.label:
            text = ",".join([self.name, *(f"{k}={v}" for k, v in self.options)])
            object.__setattr__(self, "label", text)

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """From ``name[,key=value...]``, e.g. ``dynamic,window=8,variable_batch=false`` or
        ``static,shuffle=partial,q=0.1``."""
        name, *pairs = [p.strip() for p in text.strip().split(",")]
        options = []
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq:
                raise ValueError(f"--config {text!r}: {pair!r} must be key=value")
            options.append((key, _value(text, key, value)))
        return cls(name, tuple(options), text.strip())

    @property
    def is_dynamic(self) -> bool:
        """Whether the strategy's mode re-plans from measured speeds (a coordinator's)."""
        return as_mode(_PLANS.get(self.name, {}).get("kind", "static")).opens_session

    def schedule_config(
        self,
        world: int,
        batch_size: int,
        seed: int,
        cost: CostModel,
        groups: tuple[int, ...] | None,
    ) -> ScheduleConfig:
        """The ``ScheduleConfig`` this strategy runs (for a baseline: the torch split, i.e.
        ``batch_size=None``, from which both baselines take their epoch order)."""
        options = dict(self.options)
        shuffle = options.pop("shuffle", "global")
        policy = {k: options.pop(k) for k in _POLICY_KEYS if k in options}
        if shuffle == "stratified":
            raise ValueError(
                f"--config {self.label}: shuffle=stratified needs class labels, which the "
                f"simulator does not have; use global, local, partial, block or none"
            )
        kwargs: dict[str, Any] = {
            "num_replicas": world,
            "batch_size": batch_size,
            "seed": seed,
            "cost": cost,
            "groups": groups,
            "shuffle": ShufflePolicy(shuffle, **policy),
        }
        if self.name in BASELINES:
            kwargs.update(batch_size=None, shuffle=True)
        else:
            kwargs.update(_PLANS[self.name])
        if self.name == "packed":
            kwargs.update(packing=self._packing(options))
        kwargs.update(options)
        try:
            return ScheduleConfig(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--config {self.label}: {exc}") from None

    def _packing(self, options: dict[str, Any]) -> Packing:
        """The ``Packing`` of a ``packed`` strategy (its keys leave ``options``)."""
        keys = [k for k in (*_PACKING_INT_KEYS, *_PACKING_STR_KEYS) if k in options]
        values = {k: options.pop(k) for k in keys}
        if "max_tokens" not in values:
            raise ValueError(
                f"--config {self.label}: packed needs max_tokens= (tokens in one micro-batch)"
            )
        delay = {k: options.pop(k) for k in _OUTLIER_KEYS if k in options}
        try:
            if options.pop("outliers", bool(delay)):
                values["outliers"] = OutlierDelay(**delay)
            elif delay:
                raise ValueError(f"{', '.join(delay)} need outliers=true")
            return Packing(**values)
        except ValueError as exc:
            raise ValueError(f"--config {self.label}: {exc}") from None

    def assignment(self, scheduler: Scheduler, batch_size: int, epoch: int) -> Assignment:
        """The epoch's assignment of a non-dynamic strategy: chronica's plan itself, or a
        baseline built from the torch-split plan of ``scheduler``."""
        plan = scheduler.plan_epoch(epoch)
        if self.name == "torch":
            return torch_assignment(plan, batch_size)
        if self.name == "length-grouped":
            return _length_grouped(plan, scheduler.sizes, batch_size)
        return Assignment.of(plan)


def torch_assignment(plan: EpochPlan, batch_size: int) -> Assignment:
    """torch's local batches from a ``batch_size=None`` plan (one sample per rank and step,
    rank r at position r of each step): rank r's local batch at step t is its stream's
    samples ``t·k .. t·k + k - 1`` (k = B/W), a trailing shorter batch last."""
    w = plan.num_replicas
    stream = plan.indices.reshape(-1, w)  # (per-rank position, rank)
    counts = step_counts(stream.shape[0], batch_size, w)
    k = counts[0] if counts else 1
    full = stream.shape[0] // k
    head = stream[: full * k].reshape(full, k, w).transpose(0, 2, 1).ravel()
    tail = stream[full * k :].T.ravel()
    return Assignment(np.concatenate([head, tail]), _equal_bounds(counts, w))


def add_counts(total: np.ndarray, counts: Any) -> np.ndarray:
    """Documents per delay (``PlanStats.delay_counts``) of two epochs added entry by entry.

    Args:
        total: the counts so far.
        counts: one more epoch's counts.

    Example::

        >>> add_counts(np.array([5, 1]), (4, 0, 2)).tolist()
        [9, 1, 2]
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    size = max(total.shape[0], counts.shape[0])
    return np.pad(total, (0, size - total.shape[0])) + np.pad(counts, (0, size - counts.shape[0]))


def _length_grouped(plan: EpochPlan, sizes: np.ndarray, batch_size: int) -> Assignment:
    w = plan.num_replicas
    stream = plan.indices  # the padded permutation, in order
    n = stream.shape[0]
    counts = step_counts(n // w, batch_size, w)
    k = counts[0] if counts else 1
    mult = max(1, min(n // (4 * k), _MEGABATCH_MULT))
    megabatch = np.arange(n) // (mult * k)
    grouped = stream[np.lexsort((-sizes[stream], megabatch))]
    longest = int(np.argmax(sizes[grouped]))
    grouped[[0, longest]] = grouped[[longest, 0]]
    return Assignment(grouped, _equal_bounds(counts, w))


def _equal_bounds(counts: list[int], world: int) -> np.ndarray:
    per_step = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(per_step * world)[:-1]]).astype(np.int64)
    return starts[:, None] + per_step[:, None] * np.arange(world + 1)[None, :]


def _value(text: str, key: str, value: str) -> Any:
    try:
        if key in _INT_KEYS:
            return int(value)
        if key in _FLOAT_KEYS:
            return float(value)
        if key in _BOOL_KEYS:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{value!r} is not true or false")
            return value.lower() in ("true", "1")
    except ValueError as exc:
        raise ValueError(f"--config {text!r}: {key}={value!r}: {exc}") from None
    if key in _STR_KEYS:
        return value
    known = _INT_KEYS + _FLOAT_KEYS + _BOOL_KEYS + _STR_KEYS
    raise ValueError(f"--config {text!r}: unknown option {key!r}; known: {', '.join(known)}")
