"""The scheduler: from sizes and a configuration to one ``EpochPlan`` per epoch.

A plan is a pure function of (sizes, configuration, epoch): every rank computes the same
bytes locally. Kinds:

``static``, ``exact=True`` (default)
    Global batches are exactly what plain data-parallel training forms: consecutive
    ``batch_size`` samples of the epoch's permutation (torch's order semantics, padding and
    ``drop_last``). Only the split of each batch between ranks changes, so every step
    averages the gradient over the same samples and the training maths is unchanged.
``static``, ``exact=False`` (pool balancing, upstream Chronica's ``static``)
    The epoch's samples are packed into ``steps × W`` local batches of equal count and
    near-equal cost (LPT in rounds over the whole epoch), then local batches of similar
    cost form a step, so heavy samples share a step with other heavy samples, and every
    step is balanced between its ranks (``chronica.core.pool``). This changes step
    composition: a step is no longer a uniform random batch.
``dynamic``
    The global batches of ``static`` exact mode, split between ranks by *measured* speed:
    rank 0's coordinator fits every rank's time from its reports and plans window after
    window so predicted per-rank times are equal (``chronica.core.dynamic``); with
    ``variable_batch=True`` faster ranks also get more samples. ``plan_epoch`` returns the
    static plan these windows re-split, which is also the fallback when no coordinator
    answers: both contain the same samples at every step.
``guided``
    Samples of similar size share a step (sorted, with a little seeded jitter so steps
    differ between epochs), minimising padding; then each step is balanced. Changes step
    composition like length-grouped samplers do.

In pool and guided modes the order of steps is shuffled from the seed. A trailing partial
step (``len % batch_size``) always stays last and keeps equal counts per rank.

The shuffle policy (``chronica.core.shuffle``) decides each *owner*'s samples for the epoch
(an owner is a node when ``groups`` are given, else a rank; with a non-partitioned policy and
no groups there is one owner, everyone). Every step, each owner contributes ``ranks × B/W``
of its samples and the kind decides which, and how they are split between its ranks; a rank
never receives a sample of another owner's partition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from chronica.core.balance import balance_steps
from chronica.core.checks import check_int
from chronica.core.config import ScheduleConfig
from chronica.core.cost import CostModel
from chronica.core.grouping import grouped_by_size
from chronica.core.packing import pack_epoch, pieces
from chronica.core.partition import (
    Owners,
    _fitted,
    base_partitions,
    epoch_partitions,
    fitted_order,
)
from chronica.core.plan import EpochPlan, MicroLayout, PlanStats
from chronica.core.pool import pool_steps
from chronica.core.rng import Stream, derive_key, permutation
from chronica.core.shuffle import epoch_order
from chronica.core.sizes import sizes_digest, validate_sizes

__all__ = ["Scheduler", "per_replica", "step_counts"]

# A plan's parts: (indices, bounds, loads) as in ``EpochPlan``.
_Parts = tuple[np.ndarray, np.ndarray, np.ndarray]


def per_replica(num_samples: int, num_replicas: int, drop_last: bool) -> int:
    """Samples each rank receives when ``num_samples`` are dealt to ``num_replicas`` ranks:
    torch's ``len(DistributedSampler)``, padding up (or, with ``drop_last``, cutting down)."""
    if drop_last:
        return num_samples // num_replicas
    return -(-num_samples // num_replicas)


def step_counts(per_rank: int, batch_size: int | None, num_replicas: int) -> list[int]:
    """Samples per rank at each step: ``batch_size / num_replicas`` per full step, then the
    remainder of ``per_rank`` as a trailing partial step (one per step without a batch)."""
    k = 1 if batch_size is None else batch_size // num_replicas
    return [k] * (per_rank // k) + ([per_rank % k] if per_rank % k else [])


def _step_starts(counts: list[int], ranks: int) -> np.ndarray:
    """Where every step starts in a step-major stream, plus the end: ``steps + 1`` values."""
    ends = np.cumsum(np.asarray(counts, dtype=np.int64) * ranks)
    return np.concatenate([np.zeros(1, dtype=np.int64), ends])


class Scheduler:
    """Plans epochs for ``sizes`` under ``config``. Plans depend only on (sizes, config,
    labels, partitions, epoch): equal inputs give byte-identical plans on every rank,
    process and restart. The plans of the two epochs planned last are cached.

    Args:
        sizes: one finite, non-negative size per sample (validated once).
        config: the plan request.
        labels: one class per sample, needed by ``shuffle="stratified"``.
        partitions: one index list per node (e.g. what is on each node's disk), replacing
            the built partitions of ``local``/``partial`` policies.

    Example::

        >>> import numpy as np
        >>> from chronica.core import ScheduleConfig, Scheduler
        >>> plan = Scheduler(np.arange(1, 65), ScheduleConfig(4, 16)).plan_epoch(0)
        >>> plan.num_steps, sorted(plan.indices.tolist()) == list(range(64))
        (4, True)
    """

    def __repr__(self) -> str:
        return f"Scheduler({self.num_samples} samples, {self.config!r})"

    def __init__(
        self,
        sizes: Any,
        config: ScheduleConfig,
        *,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
    ) -> None:
        self.sizes = validate_sizes(sizes)
        self.config = config
        # With packing, what is trained is pieces of documents (``Pieces``): their costs are
        # what balance, and a document costs the sum of its pieces'.
        self.pieces = None if config.packing is None else pieces(self.sizes, config.packing)
        if self.pieces is None:
            self.costs = _costs(config.cost, self.sizes)
        else:
            self.piece_costs = config.cost(self.pieces.length)
            self.costs = np.add.reduceat(self.piece_costs, self.pieces.first[:-1])
        policy = config.shuffle
        # Nodes (or ranks, without groups) hold data; only partitioned policies tie samples
        # to them. Otherwise any rank may read any sample: one owner, every rank.
        self.nodes = Owners.of(config.groups, config.num_replicas)
        self.owners = (
            self.nodes
            if policy.partitioned
            else Owners.of([0] * config.num_replicas, config.num_replicas)
        )
        self.labels = None if labels is None else _validate_labels(labels, self.num_samples)
        if policy.needs_labels and self.labels is None:
            raise ValueError("shuffle='stratified' needs labels= (one class label per sample)")
        if partitions is not None and not policy.partitioned:
            raise ValueError(
                f"partitions= only applies to shuffle='local' or 'partial', not {policy.kind!r}"
            )
        self._base = None
        if policy.partitioned:
            self._base = base_partitions(
                policy,
                self.num_samples,
                self.owners,
                self.samples_per_replica(),
                config.seed,
                partitions,
            )
        extra = [sizes_digest(self.sizes)]
        for data in (self.labels, *(partitions or ())):
            if data is not None:
                extra.append(hashlib.blake2b(np.asarray(data).tobytes(), digest_size=8).hexdigest())
        # Sizes, labels and partitions, digested: what ``config.describe`` calls ``sizes``.
        self.data_digest = "/".join(extra)
        self.digest = config.digest(self.data_digest)
        # The plans of the last two epochs asked for: ranks and the coordinator go back and
        # forth between the current epoch and the next one near its end.
        self._cached: EpochPlan | None = None
        self._previous: EpochPlan | None = None

    @property
    def num_samples(self) -> int:
        return int(self.sizes.shape[0])

    def samples_per_replica(self) -> int:
        """Samples each rank receives per epoch: torch's ``len(DistributedSampler)``."""
        return per_replica(self.num_samples, self.config.num_replicas, self.config.drop_last)

    def num_steps(self, epoch: int | None = None) -> int:
        """Steps per epoch, the same on every rank. A packed plan's count may depend on the
        epoch (a token budget cuts each epoch's order anew): ``epoch`` names it (default: the
        epoch planned last, else 0)."""
        if self.config.packing is not None:
            if epoch is None:
                epoch = 0 if self._cached is None else self._cached.epoch
            return self.plan_epoch(epoch).num_steps
        return len(self.step_counts())

    def step_counts(self) -> list[int]:
        """Samples per rank at each step of an epoch (equal on every rank): ``B / W`` per
        full step, then the remainder."""
        cfg = self.config
        return step_counts(self.samples_per_replica(), cfg.batch_size, cfg.num_replicas)

    def has_plan(self, epoch: int) -> bool:
        """Whether ``plan_epoch(epoch)`` returns at once (the scheduler holds that plan)."""
        return any(p is not None and p.epoch == epoch for p in (self._cached, self._previous))

    def plan_epoch(
        self, epoch: int, progress: Callable[[int, int], None] | None = None
    ) -> EpochPlan:
        """The plan of ``epoch`` (an int >= 0). ``progress(done, total)``, if given, is
        called as steps are planned (for a progress bar on large epochs; it counts steps of
        every node-local partition)."""
        check_int("epoch", epoch, 0)
        # No loop variable here: it would keep the older plan alive while the new one is built.
        hit = next(
            (p for p in (self._cached, self._previous) if p is not None and p.epoch == epoch), None
        )
        if hit is not None:
            return hit
        epoch = int(epoch)
        # The older cached plan is the one this plan replaces: let it go first, so that a
        # large epoch is planned next to one cached plan, not two.
        self._previous = None
        cfg = self.config
        if cfg.packing is not None:
            streams, num_padded, _ = self._owner_streams(epoch, fitted=False)
            plan = self._packed(epoch, streams, num_padded, progress)
            self._cached, self._previous = plan, self._cached
            return plan
        w, m = cfg.num_replicas, self.samples_per_replica()
        counts = self.step_counts()
        streams, num_padded, num_dropped = self._owner_streams(epoch)
        step_order = self._shuffled_steps(epoch, m // counts[0] if counts else 0)
        parts = []
        for owner, (ranks, stream) in enumerate(zip(self.owners.ranks, streams, strict=True)):
            done = owner * len(counts)
            total = self.owners.count * len(counts)
            tick = None if progress is None else partial(_offset_progress, progress, done, total)
            size = ranks.shape[0]
            parts.append(self._split(epoch, owner, stream, size, counts, step_order, tick))
            if tick is not None:
                tick(len(counts), len(counts))
        if self.owners.count == 1:
            indices, loads = parts[0]
        else:
            matrix = np.empty((w, m), dtype=np.int64)
            loads = np.empty((len(counts), w))
            for ranks, (step_major, owner_loads) in zip(self.owners.ranks, parts, strict=True):
                matrix[ranks] = _rank_major(step_major, ranks.shape[0], counts)
                loads[:, ranks] = owner_loads
            indices = _step_major(matrix, counts)
        plan = self._assemble(epoch, counts, indices, loads, num_padded, num_dropped)
        self._cached, self._previous = plan, self._cached
        return plan

    def plan_stream(self, epoch: int, stream: np.ndarray) -> EpochPlan:
        """A plan that trains ``stream`` (distinct sample indices, in order) the way exact
        mode trains an epoch's order, at this configuration's world and batch size.

        The stream is padded by repeating from its start (``drop_last=False``) or cut at its
        tail (``drop_last=True``) to equal per-rank counts, cut into global batches of
        ``batch_size`` in order (a trailing partial step last), and every batch is balanced
        between ranks by the same kernel as ``plan_epoch``. ``num_padded``/``num_dropped``
        count what padding or cutting did to the stream. Regardless of ``kind`` and
        ``shuffle``, the stream decides every step's samples; equal inputs give equal bytes.
        Elastic resume plans the rest of an epoch with it (``chronica.core.elastic``).
        A packed configuration packs the stream's steps instead, without padding.
        """
        cfg = self.config
        stream = np.asarray(stream, dtype=np.int64)
        if cfg.packing is not None:
            return self._packed(int(epoch), [stream], 0)
        w = cfg.num_replicas
        m = per_replica(stream.shape[0], w, cfg.drop_last)
        counts = step_counts(m, cfg.batch_size, w)
        order, padded, dropped = _fitted(stream, m * w)
        indices, loads = self._balanced(order, w, counts)
        return self._assemble(int(epoch), counts, indices, loads, padded, dropped)

    def _packed(
        self,
        epoch: int,
        streams: list[np.ndarray],
        num_padded: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> EpochPlan:
        """The packed plan of every owner's document stream (``chronica.core.packing``)."""
        cfg = self.config
        assert cfg.packing is not None and self.pieces is not None
        packed = pack_epoch(
            streams,
            self.owners.ranks,
            cfg.num_replicas,
            self.pieces,
            self.piece_costs,
            cfg.packing,
            cfg.batch_size,
            cfg.drop_last,
            progress,
        )
        micro = MicroLayout(**packed.layout, capacity=cfg.packing.rows * cfg.packing.length)
        plan = EpochPlan(
            epoch=epoch,
            num_replicas=cfg.num_replicas,
            indices=packed.indices,
            bounds=packed.bounds,
            loads=packed.loads,
            num_padded=num_padded,
            num_dropped=packed.num_dropped,
            digest=self.digest,
            micro=micro,
        )
        for array in (plan.indices, plan.bounds, plan.loads, *packed.layout.values()):
            array.setflags(write=False)
        return plan

    def _assemble(
        self,
        epoch: int,
        counts: list[int],
        indices: np.ndarray,
        loads: np.ndarray,
        num_padded: int,
        num_dropped: int,
    ) -> EpochPlan:
        """The read-only plan of step-major ``indices`` with ``counts`` per rank and step."""
        w = self.config.num_replicas
        per_step = np.asarray(counts, dtype=np.int64)
        starts = _step_starts(counts, w)[:-1]
        # Built in place: without a batch, bounds have one row per sample of a rank.
        bounds = np.multiply.outer(per_step, np.arange(w + 1, dtype=np.int64))
        bounds += starts[:, None]
        plan = EpochPlan(
            epoch=epoch,
            num_replicas=w,
            indices=indices,
            bounds=bounds,
            loads=loads,
            num_padded=num_padded,
            num_dropped=num_dropped,
            digest=self.digest,
        )
        for array in (plan.indices, plan.bounds, plan.loads):
            array.setflags(write=False)
        return plan

    def stats(self, epoch: int) -> PlanStats:
        """Balance and padding diagnostics of ``epoch``'s plan."""
        return self.plan_stats(self.plan_epoch(epoch))

    def plan_stats(self, plan: EpochPlan) -> PlanStats:
        """Balance and padding diagnostics of one of this scheduler's plans."""
        if self.pieces is not None and plan.micro is not None:
            return plan.stats(self.pieces.length.astype(np.float64), self.piece_costs)
        return plan.stats(self.sizes, self.costs)

    def node_samples(self, epoch: int) -> list[np.ndarray]:
        """The samples every node (every rank, without ``groups``) trains on in ``epoch``."""
        plan = self.plan_epoch(epoch)
        per_rank = [plan.rank_indices(r) for r in range(self.config.num_replicas)]
        return [np.concatenate([per_rank[r] for r in ranks]) for ranks in self.nodes.ranks]

    def base_partitions(self) -> list[np.ndarray] | None:
        """Every node's fixed partition under ``local``/``partial``, else ``None``."""
        return None if self._base is None else self._base[0]

    # -- epoch order ---------------------------------------------------------------------

    def _owner_streams(self, epoch: int, fitted: bool = True) -> tuple[list[np.ndarray], int, int]:
        """Every owner's samples for the epoch in order, ``ranks × m`` each (with ``fitted``
        false, one owner's order is left as long as the data set)."""
        cfg = self.config
        if self._base is not None:
            base, padded, dropped = self._base
            return epoch_partitions(cfg.shuffle, base, cfg.seed, epoch), padded, dropped
        if not fitted:
            order = epoch_order(cfg.shuffle, self.num_samples, cfg.seed, epoch, self.labels)
            return [order], 0, 0
        total = self.samples_per_replica() * cfg.num_replicas
        order, padded, dropped = fitted_order(
            cfg.shuffle, self.num_samples, cfg.seed, epoch, self.labels, total
        )
        return [order], padded, dropped

    def _shuffled_steps(self, epoch: int, full_steps: int) -> np.ndarray:
        """The order of full steps for pool and guided, the same for every owner."""
        cfg = self.config
        if not cfg.shuffle.shuffles:
            return np.arange(full_steps)
        return permutation(full_steps, derive_key(cfg.seed, epoch, Stream.STEPS))

    # -- one owner's split -------------------------------------------------------------------

    def _split(
        self,
        epoch: int,
        owner: int,
        stream: np.ndarray,
        ranks: int,
        counts: list[int],
        step_order: np.ndarray,
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The owner's samples step after step (``ranks × k`` per step, rank after rank) and
        their per-rank loads, shape ``(steps, ranks)``."""
        cfg = self.config
        if cfg.batch_size is not None:
            k = counts[0] if counts else 1
            full = sum(1 for c in counts if c == k)
            if cfg.mode.groups_by_size:
                stream = self._grouped_by_size(epoch, owner, stream, ranks * k, step_order)
            elif not cfg.exact and full:
                starts = _step_starts(counts, ranks)
                return self._pooled(epoch, owner, stream, ranks, starts, full, step_order)
        return self._balanced(stream, ranks, counts, progress)

    def _balanced(
        self,
        stream: np.ndarray,
        ranks: int,
        counts: list[int],
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact mode's split: consecutive steps of ``stream``, each balanced between ranks."""
        if self.config.batch_size is None:
            # torch's split: rank r takes positions r, r + W, ...; one sample per step.
            return stream.astype(np.int64), self.costs[stream].reshape(-1, ranks)
        starts = _step_starts(counts, ranks)
        return balance_steps(self.costs, starts, ranks, progress=progress, index=stream)

    def _grouped_by_size(
        self, epoch: int, owner: int, stream: np.ndarray, per_step: int, step_order: np.ndarray
    ) -> np.ndarray:
        key = derive_key(self.config.seed, epoch, Stream.JITTER, owner)
        return grouped_by_size(self.costs, stream, key, self.config.jitter, per_step, step_order)

    def _pooled(
        self,
        epoch: int,
        owner: int,
        stream: np.ndarray,
        ranks: int,
        starts: np.ndarray,
        full: int,
        step_order: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        # The full steps by pool balancing (chronica.core.pool), the partial tail as exact
        # mode splits it.
        indices = np.empty(stream.shape[0], np.int64)
        loads = np.empty((len(starts) - 1, ranks))
        pool = stream[: starts[full]]
        key = derive_key(self.config.seed, epoch, Stream.JITTER, owner)
        indices[: starts[full]], loads[:full] = pool_steps(
            self.costs[pool], pool, ranks, step_order, key, self.config.jitter
        )
        tail = starts[full:]
        indices[tail[0] :], loads[full:] = balance_steps(
            self.costs, tail - tail[0], ranks, index=stream[tail[0] :]
        )
        return indices, loads


def _rank_major(step_major: np.ndarray, ranks: int, counts: list[int]) -> np.ndarray:
    """From steps of ``ranks × k`` (rank after rank within a step) to one row per rank."""
    out = np.empty((ranks, sum(counts)), dtype=np.int64)
    pos = col = 0
    for k in sorted(set(counts), reverse=True):
        steps = counts.count(k)
        block = step_major[pos : pos + steps * ranks * k].reshape(steps, ranks, k)
        out[:, col : col + steps * k] = block.transpose(1, 0, 2).reshape(ranks, steps * k)
        pos += steps * ranks * k
        col += steps * k
    return out


def _step_major(matrix: np.ndarray, counts: list[int]) -> np.ndarray:
    """The inverse of ``_rank_major`` for all ranks: steps after steps, ranks within."""
    ranks = matrix.shape[0]
    parts, col = [], 0
    for k in sorted(set(counts), reverse=True):
        steps = counts.count(k)
        block = matrix[:, col : col + steps * k].reshape(ranks, steps, k)
        parts.append(block.transpose(1, 0, 2).ravel())
        col += steps * k
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _costs(model: CostModel, sizes: np.ndarray) -> np.ndarray:
    """``model(sizes)``, read-only; the sizes themselves when the model is the identity
    (``0 + 1·s`` is ``s`` bit for bit, except ``-0.0``, which it turns into ``0.0``), so a
    large data set does not hold its sizes twice."""
    if model.to_tuple() == (0.0, 1.0, 0.0) and not np.signbit(sizes).any():
        return sizes
    costs = model(sizes)
    costs.setflags(write=False)
    return costs


def _validate_labels(labels: Any, n: int) -> np.ndarray:
    values = np.asarray(labels)
    if values.ndim != 1 or values.shape[0] != n:
        raise ValueError(
            f"labels must be 1-D with one label per sample ({n}), got shape {values.shape}"
        )
    return values


def _offset_progress(
    progress: Callable[[int, int], None], offset: int, total: int, done: int, _: int
) -> None:
    """One partition's progress as progress over all partitions' steps."""
    progress(offset + done, total)
