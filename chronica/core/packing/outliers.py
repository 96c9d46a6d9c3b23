"""Outlier delay: documents too heavy for their step wait, within bounds, for a later step
of the same epoch where they fit.

A step can never be shorter than its heaviest document. With long-tailed lengths and
attention cost that *wall* sets the step time whenever few documents share a rank.
``OutlierDelay`` (given as ``Packing(outliers=...)``, or driving an ``OutlierQueue`` beside
``chronica.plan_step``) moves such documents to later steps so that heavy documents train
side by side, one per rank, instead of one that every other rank waits for.

A document's *weight* is its heaviest piece's predicted cost, its *cost* the sum of its
pieces'. A step's *fair share* is the cost of the documents the epoch's order puts in it
divided by its ranks ``W``. A document heavier than ``threshold`` times its step's fair share
is an *outlier*; only outliers move, never earlier, at most ``max_delay`` steps later, never
past the epoch's last step (whose own documents stay), with at most ``max_queue`` documents
waiting at any step boundary.

Where they go:

* **A packed epoch** (``Packing(outliers=...)``, ``delay_outliers``): the epoch's order is
  known, so the outliers are placed heaviest first, each into the step of its window where
  it lengthens the step's predicted time least, the earliest among near-equals. A step's
  predicted time is ``max(total / W, heaviest, the two outliers one rank must take once a
  step has more outliers than ranks)``: heavy documents gather in the same steps, one per
  rank, and light ones fill the steps whose time a heavy document already sets.
* **Step by step** (``OutlierQueue``, the future unknown): outliers join a queue; every step
  releases the documents that have waited ``max_delay`` steps (all of them at the epoch's
  last step, and the oldest beyond ``max_queue``), plus the held documents no heavier than
  the largest *top* that keeps the step within its fair share (``W · heaviest <= total``).

Guarantees (both): every document is trained exactly once in its epoch, in the step the
epoch's order puts it in or at most ``max_delay`` steps later; at most ``max_queue``
documents wait at once; none waits past the epoch's last step. A packed epoch's steps are a
pure function of its document order, costs and the option (equal inputs, equal bytes on
every rank), so the queue at any step is implied by the plan and needs no state of its own;
``OutlierQueue`` checkpoints its queue with ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from chronica.core.checks import check_bool, check_int, check_number
from chronica.core.cost import as_cost_model

__all__ = ["OutlierDelay", "OutlierQueue", "Released", "delay_outliers"]

# Relative slack of the fair-share test: float sums in another order must not flip it.
_SLACK = 1e-12
_EARLIER = 0.05  # within this share of a document's fair cost, the earliest step wins


@dataclass(frozen=True)
class OutlierDelay:
    """Move documents heavier than a share of their step's fair share to later steps of the
    same epoch, within bounds (module docstring: the rule). Validated
    on construction: ``TypeError`` for a wrong type, ``ValueError`` for a wrong value.

    Args:
        threshold: a document is an outlier when its heaviest piece costs more than
            ``threshold`` times the step's fair share (the cost of the step's documents /
            its ranks), ``> 0``; default 0.5: half a rank's mean load.
        max_delay: the most steps a document waits, ``>= 1``.
        max_queue: the most documents waiting at once, ``>= 1``; ``None``: four times the
            ranks that train the step.

    Example::

        >>> OutlierDelay(max_delay=8)
        OutlierDelay(threshold=0.5, max_delay=8, max_queue=None)
    """

    threshold: float = 0.5
    max_delay: int = 16
    max_queue: int | None = None

    def __post_init__(self) -> None:
        threshold = check_number("threshold", self.threshold, 0.0, hint=" (factor of fair share)")
        if threshold == 0.0:
            raise ValueError("threshold=0.0 must be > 0 (a factor of a rank's fair share)")
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(
            self, "max_delay", check_int("max_delay", self.max_delay, 1, hint=" (steps)")
        )
        if self.max_queue is not None:
            object.__setattr__(
                self, "max_queue", check_int("max_queue", self.max_queue, 1, hint=" or None")
            )

    def queue_bound(self, ranks: int) -> int:
        """The most documents held at once for a step trained by ``ranks`` ranks.

        Args:
            ranks: the ranks that train the step.
        """
        return 4 * ranks if self.max_queue is None else self.max_queue

    def to_tuple(self) -> tuple[float, int, int | None]:
        """Every field, JSON-ready (part of the configuration digest)."""
        return (self.threshold, self.max_delay, self.max_queue)


class _Queue:
    """The held documents of one owner (``ranks`` ranks): numbers, costs, weights, the step
    each joined and a payload (a length, for ``OutlierQueue``), oldest first."""

    def __init__(self, ranks: int, delay: OutlierDelay) -> None:
        self.ranks = ranks
        self.delay = delay
        self.held = _empty()

    def step(
        self, new: dict[str, np.ndarray], step: int, last: bool
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Step ``step``'s documents (``new``: ``ids``, ``costs``, ``weights``,
        ``payload``, in order): the documents to train now and each one's delay."""
        held_back = np.zeros(new["ids"].shape[0], bool)
        if not last:
            held_back = _outliers(new, self.ranks, self.delay.threshold)
        regular = _take(new, ~held_back)
        joined = _take(new, held_back)
        joined["since"] = np.full(joined["ids"].shape[0], step, np.int64)
        pool = _concat(self.held, joined)
        forced = np.full(pool["ids"].shape[0], last) | (
            pool["since"] + self.delay.max_delay <= step
        )
        waiting = np.flatnonzero(~forced)
        excess = waiting.shape[0] - self.delay.queue_bound(self.ranks)
        if excess > 0:
            forced[waiting[:excess]] = True
        out = _released(pool, forced, regular, self.ranks)
        self.held = _take(pool, ~out)
        released = _take(pool, out)
        delays = np.concatenate([step - released.pop("since"), np.zeros(regular["ids"].shape[0])])
        return _concat(released, regular), delays.astype(np.int64)


def _outliers(new: dict[str, np.ndarray], ranks: int, threshold: float) -> np.ndarray:
    """Which of ``new`` weigh more than ``threshold`` times the step's fair share."""
    fair = float(new["costs"].sum()) / ranks
    return new["weights"] > threshold * fair * (1 + _SLACK)


def _released(
    pool: dict[str, np.ndarray], forced: np.ndarray, regular: dict[str, np.ndarray], ranks: int
) -> np.ndarray:
    """Which of ``pool`` go into the step: ``forced`` ones and those no heavier than the
    largest *top* that keeps ``ranks · heaviest <= total``; failing that, those no heavier
    than the forced ones or the step's own heaviest document."""
    n = pool["ids"].shape[0]
    if n == 0:
        return np.zeros(0, bool)
    order = np.argsort(-pool["weights"], kind="stable")
    weight, cost, must = pool["weights"][order], pool["costs"][order], forced[order]
    floor = max(float(weight[must].max()) if must.any() else 0.0, _max(regular["weights"]))
    suffix = np.cumsum(cost[::-1])[::-1]
    forced_before = np.concatenate([[0.0], np.cumsum(np.where(must, cost, 0.0))[:-1]])
    total = float(regular["costs"].sum()) + suffix + forced_before
    fits = ranks * np.maximum(weight, floor) <= total * (1 + _SLACK)
    first = int(np.argmax(fits)) if fits.any() else int(np.argmax(weight <= floor))
    if not fits.any() and not (weight <= floor).any():
        first = n
    chosen = must.copy()
    chosen[first:] = True
    out = np.empty(n, bool)
    out[order] = chosen
    return out


def _max(values: np.ndarray) -> float:
    return float(values.max()) if values.shape[0] else 0.0


_FIELDS = ("ids", "costs", "weights", "payload", "since")


def _empty() -> dict[str, np.ndarray]:
    return {
        "ids": np.empty(0, np.int64),
        "costs": np.empty(0),
        "weights": np.empty(0),
        "payload": np.empty(0, np.int64),
        "since": np.empty(0, np.int64),
    }


def _take(arrays: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {key: value[mask] for key, value in arrays.items()}


def _concat(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([first[key], second[key]]) for key in first}


def delay_outliers(
    steps: Sequence[np.ndarray],
    costs: np.ndarray,
    weights: np.ndarray,
    ranks: int,
    delay: OutlierDelay,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One owner's steps with outliers delayed (module docstring: a packed epoch): the
    documents of every step (the step's own in order, then the delayed ones by the step
    they came from) and each one's delay in steps. Pure: equal arguments give equal arrays.

    Args:
        steps: the documents of every step, in the epoch's order.
        costs: predicted cost of every document (indexed by document number).
        weights: every document's heaviest piece's cost (its outlier test).
        ranks: the ranks that train the steps.
        delay: the option.

    Example::

        >>> costs = np.array([1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 9.0, 1.0])
        >>> steps, delays = delay_outliers(
        ...     [np.arange(4), np.arange(4, 8)], costs, costs, 2, OutlierDelay())
        >>> [s.tolist() for s in steps], [d.tolist() for d in delays]
        ([[0, 1, 3], [4, 5, 6, 7, 2]], [[0, 0, 0], [0, 0, 0, 0, 1]])
    """
    num = len(steps)
    docs = [np.asarray(d, dtype=np.int64) for d in steps]
    origin = np.concatenate(
        [np.full(d.shape[0], s, np.int64) for s, d in enumerate(docs)] or [np.empty(0, np.int64)]
    )
    every = np.concatenate(docs or [np.empty(0, np.int64)])
    cost, weight = costs[every].astype(np.float64), weights[every].astype(np.float64)
    fair = np.array([costs[d].sum() for d in docs]) / ranks
    outlier = weight > delay.threshold * fair[origin] * (1 + _SLACK) if num else origin > 0
    outlier &= origin < num - 1  # the last step's own documents have nowhere to go
    regular = ~outlier
    total = np.bincount(origin[regular], weights=cost[regular], minlength=num)
    heaviest = np.zeros(num)
    np.maximum.at(heaviest, origin[regular], weight[regular])
    waiting = np.zeros(num + 1, np.int64)  # documents held when step ``s`` starts
    placed: list[list[float]] = [[] for _ in range(num)]  # outliers' weights, descending
    pair = np.zeros(num)  # the heaviest two outliers one rank must take (more than ranks)
    bound = delay.queue_bound(ranks)
    step_of = origin.copy()
    for i in np.flatnonzero(outlier)[np.argsort(-weight[outlier], kind="stable")]:
        first = int(origin[i])
        last = min(first + delay.max_delay, num - 1)
        full = np.flatnonzero(waiting[first + 1 : last + 1] >= bound)
        if full.shape[0]:
            last = first + int(full[0])
        span = slice(first, last + 1)
        w, c = float(weight[i]), float(cost[i])
        doubled = np.array(
            [_doubled(placed[s], w, ranks) for s in range(first, last + 1)], dtype=np.float64
        )
        before = np.maximum(np.maximum(total[span] / ranks, heaviest[span]), pair[span])
        after = np.maximum(
            np.maximum((total[span] + c) / ranks, np.maximum(heaviest[span], w)),
            np.maximum(pair[span], doubled),
        )
        grow = after - before
        s = first + int(np.argmax(grow <= grow.min() + _EARLIER * c / ranks))
        step_of[i] = s
        total[s] += c
        heaviest[s] = max(heaviest[s], w)
        pair[s] = max(pair[s], _doubled(placed[s], w, ranks))
        placed[s].append(w)
        waiting[first + 1 : s + 1] += 1
    # Every step: its own documents in order, then the delayed ones by the step they left.
    order = np.lexsort((np.arange(every.shape[0]), origin * outlier, outlier, step_of))
    cuts = np.cumsum(np.bincount(step_of, minlength=num))[:-1]
    out = np.split(every[order], cuts)
    delays = np.split((step_of - origin)[order], cuts)
    return out, delays


def _doubled(placed: list[float], weight: float, ranks: int) -> float:
    """What the rank that takes a document of ``weight`` carries, after ``placed`` heavier
    ones (descending) in a step of ``ranks`` ranks: 0 while every rank has one at most, else
    that document with the one it joins (largest-first packing pairs them head to tail)."""
    k = len(placed)
    if k < ranks:
        return 0.0
    partner = 2 * ranks - 1 - k
    return weight + placed[partner] if partner >= 0 else weight + placed[-1]


class Released(NamedTuple):
    """What ``OutlierQueue.step`` hands back: the documents to plan this step.

    Args:
        ids: their numbers (held ones first, oldest first, then this step's own in order).
        lengths: their lengths in tokens.
        delays: the steps each one waited (0 for this step's own).
    """

    ids: np.ndarray
    lengths: np.ndarray
    delays: np.ndarray


_STATE_VERSION = 1


class OutlierQueue:
    """Outlier delay for trainers that plan step by step (``chronica.plan_step``): give
    every step's candidate documents to ``step``, plan what it returns. Heavy documents
    (module docstring: step by step, with a document's weight its predicted cost) wait at most
    ``max_delay`` steps, at most ``max_queue`` at once; ``step(..., last=True)`` at the
    epoch's last step releases every held one. ``state_dict()`` / ``load_state_dict()``
    checkpoint the queue (JSON-ready), so a resumed job releases the same documents at
    the same steps.

    Args:
        num_replicas: the data-parallel ranks the steps are planned for, ``>= 1``.
        delay: the rule's parameters (default ``OutlierDelay()``).
        cost: predicted cost of a document from its length: a ``chronica.CostModel``,
            ``"linear"``, ``"quadratic"`` or ``(a, b, c)``; use the one given to
            ``plan_step``.

    Example::

        >>> queue = OutlierQueue(2, cost="quadratic")
        >>> queue.step([10, 11, 12, 13], [8, 8, 64, 8]).ids.tolist()
        [10, 11, 13]
        >>> queue.step([14, 15, 16, 17], [8, 8, 60, 8], last=True).ids.tolist()
        [12, 14, 15, 16, 17]
    """

    def __init__(
        self, num_replicas: int, delay: OutlierDelay | None = None, *, cost: Any = "linear"
    ) -> None:
        ranks = check_int("num_replicas", num_replicas, 1)
        delay = OutlierDelay() if delay is None else delay
        if not isinstance(delay, OutlierDelay):
            raise TypeError(f"delay={delay!r} must be a chronica.OutlierDelay (or None)")
        self.cost = as_cost_model(cost)
        self._queue = _Queue(ranks, delay)
        self._step = 0

    def __repr__(self) -> str:
        return (
            f"OutlierQueue(num_replicas={self._queue.ranks}, delay={self._queue.delay!r}, "
            f"cost={self.cost!r}, held={self.num_held})"
        )

    @property
    def num_held(self) -> int:
        """Documents waiting now."""
        return int(self._queue.held["ids"].shape[0])

    @property
    def steps_done(self) -> int:
        """Steps handed to ``step`` since the queue was built (or its state saved)."""
        return self._step

    def step(self, ids: Any, lengths: Any, *, last: bool = False) -> Released:
        """The documents to plan this step, from its candidates ``ids`` of ``lengths``
        tokens (in the epoch's order) and the held ones.

        Args:
            ids: an integer number per candidate (what the caller maps back to its data).
            lengths: tokens per candidate (whole numbers ``>= 0``).
            last: the epoch's last step: nothing is held, every held document is released.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        raw = np.asarray(lengths)
        if raw.shape != ids.shape:
            raise ValueError(f"lengths has {raw.size} entries for {ids.size} ids; give one each")
        if raw.size and (not np.issubdtype(raw.dtype, np.number) or (raw < 0).any()):
            raise ValueError("lengths must be token counts (numbers >= 0)")
        length = raw.astype(np.int64)
        costs = self.cost(length.astype(np.float64))
        new = {"ids": ids, "costs": costs, "weights": costs, "payload": length}
        released, delays = self._queue.step(new, self._step, check_bool("last", last))
        self._step += 1
        return Released(released["ids"], released["payload"], delays)

    def state_dict(self) -> dict[str, Any]:
        """The queue as a JSON-ready dict: ``version``, ``step`` (steps done) and the held
        documents' ``ids``, ``lengths`` and the ``since`` step each joined."""
        held = self._queue.held
        return {
            "version": _STATE_VERSION,
            "step": self._step,
            "ids": held["ids"].tolist(),
            "lengths": held["payload"].tolist(),
            "since": held["since"].tolist(),
        }

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state`` (a ``state_dict()``); ``ValueError`` for another version
        or invalid fields.

        Args:
            state: what ``state_dict`` returned.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            version = state.get("version") if isinstance(state, dict) else None
            raise ValueError(f"OutlierQueue state version {version!r} is not supported")
        step = check_int("state step", state.get("step"), 0)
        try:
            ids = np.asarray(state["ids"], dtype=np.int64).reshape(-1)
            lengths = np.asarray(state["lengths"], dtype=np.int64).reshape(-1)
            since = np.asarray(state["since"], dtype=np.int64).reshape(-1)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"OutlierQueue state is invalid: {error}") from None
        if not ids.shape == lengths.shape == since.shape or (since > step).any():
            raise ValueError("OutlierQueue state ids, lengths and since must match, since <= step")
        costs = self.cost(lengths.astype(np.float64))
        self._queue.held = {
            "ids": ids,
            "costs": costs,
            "weights": costs,
            "payload": lengths,
            "since": since,
        }
        self._step = step
