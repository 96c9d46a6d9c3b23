"""Drop-in replacements for ``torch.utils.data.Dataset`` and ``DistributedSampler``.

``DistributedSampler`` keeps torch's contract (``len``, padding by wrapping, ``drop_last``,
``set_epoch``, a ``ValueError`` for a bad rank) and adds one argument that matters:
``batch_size``, the *global* batch. With it, every step's samples are split between ranks
so the slowest rank's predicted cost is as low as it can be. Use ``batch_size //
num_replicas`` as the ``DataLoader``'s batch size.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import Sampler

from chronica.comm.session import DynamicSession
from chronica.core import (
    LabelSkew,
    Movement,
    PlanStats,
    ScheduleConfig,
    Scheduler,
    as_shuffle_policy,
    label_skew,
    movement,
    resolve_sizes,
)
from chronica.core.elastic import Segment, StateFormat, load_state, state_fields
from chronica.core.plan import EpochPlan
from chronica.progress import plan_epoch

__all__ = ["Dataset", "DistributedBatchSampler", "DistributedSampler"]

logger = logging.getLogger("chronica")

_STATE_VERSION = 2
# Version 1 states (no world, step, history or fingerprint) still resume at the same world.
_STATE = StateFormat(versions=(1, 2))

# An elastically resumed epoch: the worlds it ran at before (oldest first) and the plan of
# the samples they left, which replaces the epoch's ordinary plan until ``set_epoch``.
_Resumed = tuple[tuple[Segment, ...], EpochPlan]


class Dataset(_TorchDataset):
    """A ``torch.utils.data.Dataset`` whose samples can say how big they are.

    Override ``__sizeof__(self, index)`` to return the relative size of sample ``index``
    (frames, tokens, seconds); chronica calls it once per sample when a sampler is built.
    The default makes every sample size 1. Called without an index it is Python's usual
    ``__sizeof__``, so ``sys.getsizeof`` keeps working.
    """

    def __sizeof__(self, index: int | None = None) -> int:
        if index is None:
            return object.__sizeof__(self)
        return 1

    __sizeof__.__chronica_default__ = True  # type: ignore[attr-defined]


def _resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "num_replicas and rank were not given and torch.distributed is not "
                "initialized; call dist.init_process_group(...) first or pass both"
            )
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas={num_replicas!r} must be an int >= 1")
    if not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
        )
    return num_replicas, rank


def _groups_from_environment(num_replicas: int) -> list[int] | None:
    """Nodes of ``LOCAL_WORLD_SIZE`` consecutive ranks (torchrun's layout), if it is set."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if not local:
        return None
    size = int(local)
    if size < 1 or num_replicas % size:
        raise ValueError(
            f"LOCAL_WORLD_SIZE={local} does not divide the world size {num_replicas}; "
            f"pass groups= (the node id of every rank)"
        )
    return [r // size for r in range(num_replicas)]


def _agreement(num_replicas: int) -> Callable[[int], bool] | None:
    """Whether all ranks hold the same positive token (a plan generation; 0 for none), over
    a gloo group of their own, so that every rank takes the same source (the same planning
    of the window, or the static plan) for each window. ``None`` without a process group of
    this world size; then each rank decides alone."""
    if num_replicas == 1:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        logger.warning(
            "chronica: kind='dynamic' without torch.distributed: ranks cannot agree to fall "
            "back together if the coordinator fails mid-window; initialise the process "
            "group before building the sampler"
        )
        return None
    if dist.get_world_size() != num_replicas:
        raise ValueError(
            f"num_replicas={num_replicas} differs from the process group's world size "
            f"{dist.get_world_size()}; kind='dynamic' needs one rank per replica"
        )
    group = dist.new_group(backend="gloo")

    def agree(token: int) -> bool:
        # One all-reduce: the minimum of (token, -token) gives the smallest and largest.
        both = torch.tensor([token, -token], dtype=torch.int64)
        dist.all_reduce(both, op=dist.ReduceOp.MIN, group=group)
        low, high = int(both[0]), -int(both[1])
        return low == high > 0

    return agree


class _ScheduledSampler:
    """What both samplers share: the scheduler, the epoch, and resumable progress."""

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None,
        rank: int | None,
        shuffle: Any,
        seed: int,
        drop_last: bool,
        batch_size: int | None,
        kind: str,
        sizes: Any,
        cost: Any,
        exact: bool,
        groups: Sequence[Any] | None,
        labels: Any,
        partitions: Sequence[Any] | None,
        dynamic: dict[str, Any],
    ) -> None:
        self.num_replicas, self.rank = _resolve_world(num_replicas, rank)
        policy = as_shuffle_policy(shuffle)
        if groups is None and policy.partitioned:
            groups = _groups_from_environment(self.num_replicas)
        config = ScheduleConfig(
            num_replicas=self.num_replicas,
            batch_size=batch_size,
            kind=kind,
            exact=exact,
            shuffle=policy,
            seed=seed,
            drop_last=drop_last,
            cost=cost,
            groups=groups,
            variable_batch=dynamic["variable_batch"],
            window=dynamic["window"],
            min_batch=dynamic["min_batch"],
            max_batch=dynamic["max_batch"],
        )
        self.scheduler = Scheduler(
            resolve_sizes(dataset, sizes), config, labels=labels, partitions=partitions
        )
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.batch_size = batch_size
        self.epoch = 0
        self._start = 0  # where the next iteration begins (samples or steps)
        self._progress = 0  # how far the current iteration has got
        self._resumed: _Resumed | None = None
        if policy.partitioned and exact and batch_size and self.scheduler.owners.sizes().max() == 1:
            logger.warning(
                "chronica: with shuffle=%r and one rank per node, exact mode cannot balance "
                "(each rank trains its own partition in its own order); pass exact=False",
                policy.kind,
            )
        if batch_size is None:
            logger.warning(
                "chronica: batch_size (the global batch) was not given, so steps cannot be "
                "balanced; the sampler splits indices like torch's DistributedSampler"
            )
        self._session: DynamicSession | None = None
        self._weights: dict[int, float] = {}
        if kind == "dynamic":
            self._session = DynamicSession(
                self.scheduler,
                self.rank,
                port=dynamic["port"],
                timeout=dynamic["timeout"],
                agree=_agreement(self.num_replicas),
            )

    @property
    def num_samples(self) -> int:
        """Samples this rank receives per epoch (torch's ``num_samples``)."""
        return self.scheduler.samples_per_replica()

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate next; call it before each epoch, as with torch.
        Selecting the current epoch again keeps a loaded mid-epoch position."""
        if epoch != self.epoch:
            self._start = 0
            self._progress = 0
            self._resumed = None
        self.epoch = epoch

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The whole plan (all ranks) of ``epoch``, the current one by default. After a
        ``load_state_dict`` at another world size or batch size, the current epoch's plan is
        that of its remaining samples (see ``load_state_dict``)."""
        epoch = self.epoch if epoch is None else epoch
        if self._resumed is not None and epoch == self.epoch:
            return self._resumed[1]
        return plan_epoch(self.scheduler, epoch)

    def stats(self, epoch: int | None = None) -> PlanStats:
        """Balance and padding diagnostics of ``epoch``'s plan (the current one by default)."""
        return self.plan(epoch).stats(self.scheduler.sizes, self.scheduler.costs)

    def loss_weights(self, epoch: int | None = None) -> np.ndarray:
        """This rank's loss weight for every step of ``epoch``: multiply the local mean loss by
        it so the all-reduced average gradient is the mean over the step's global batch
        (all ones while every rank has the same count). With ``kind="dynamic"`` the plan of
        a step is known once the sampler has yielded it: the current epoch's steps yielded so
        far have their weight, the others are NaN."""
        if self._session is None or (self._resumed is not None and epoch in (None, self.epoch)):
            return self.plan(epoch).loss_weights[:, self.rank]
        weights = np.full(self.scheduler.num_steps(), np.nan)
        if epoch is None or epoch == self.epoch:
            for step, weight in self._weights.items():
                weights[step] = weight
        return weights

    def loss_weight(self, step: int) -> float:
        """This rank's loss weight at ``step`` of the current epoch (see ``loss_weights``)."""
        return float(self.loss_weights()[step])

    def report(self, seconds: float, step: int | None = None) -> None:
        """Tell the dynamic scheduler this rank's own compute time for a step: forward and
        backward, *before* waiting for the gradient all-reduce (the synchronised step time
        is equal on all ranks and says nothing). ``step`` defaults to the step after the one
        reported last. ``ComputeTimer`` does this automatically for a DDP model. Without
        ``kind="dynamic"`` this does nothing."""
        if self._session is not None:
            self._session.report(seconds, step)

    def close(self) -> None:
        """Release the coordinator connection (and, on rank 0, stop the coordinator).
        Idempotent; also done at interpreter exit."""
        if self._session is not None:
            self._session.close()

    def movement(self, epoch: int | None = None, sample_bytes: Any = None) -> Movement:
        """Samples (and bytes, given ``sample_bytes`` per sample) each node fetches for
        ``epoch``; see ``chronica.core.accounting`` for what a node holds."""
        return movement(self.scheduler, self.epoch if epoch is None else epoch, sample_bytes)

    def label_skew(self, epoch: int | None = None, labels: Any = None) -> LabelSkew:
        """Jensen–Shannon divergence of batch and node label frequencies from the data
        set's, for ``epoch``; ``labels`` default to those given to the sampler."""
        labels = self.scheduler.labels if labels is None else labels
        if labels is None:
            raise ValueError("label_skew needs labels= (one class label per sample)")
        return label_skew(self.scheduler, self.epoch if epoch is None else epoch, labels)

    def state_dict(self) -> dict[str, Any]:
        """Resumable state, a small JSON-ready dict (see ``load_state_dict``).

        ``epoch``; ``progress``: what this rank's iteration of the epoch's current plan has
        yielded (samples for ``DistributedSampler``, batches for ``DistributedBatchSampler``;
        a ``DataLoader`` that prefetches makes it run ahead of training); ``rank``;
        ``digest``: the whole configuration including world and batch size. For a change of
        world: ``num_replicas``, ``batch_size``, ``step`` (the steps of the current plan whose
        samples were all yielded; a partly yielded step does not count), ``history`` (``[W,
        B, step]`` of the worlds this epoch ran at before, oldest first; empty unless it was
        resumed at another world) and ``fingerprint`` (everything else the plan depends on).
        """
        history = () if self._resumed is None else self._resumed[0]
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "progress": self._progress,
            "rank": self.rank,
            "digest": self.scheduler.digest,
            **state_fields(self.scheduler, history, self._completed_steps()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any rank's ``state_dict``).

        Same world size and batch size: the next iteration continues exactly where the saved
        one stopped, mid-step included, with the bytes an uninterrupted run would yield.

        Another world size or global batch size (elastic resume, ``chronica.core.elastic``):
        the steps completed at the saved world count as trained (a partly yielded step does
        not, so its samples are planned again); the epoch's remaining samples, in the saved
        plan's order, are planned for this world: cut into global batches of this
        ``batch_size``, each balanced between the ranks, equal step counts on every rank,
        padded by repeating from the remainder's start (``drop_last=False``) or cut at its
        tail (``drop_last=True``). Over the trained steps and the remainder every sample
        appears exactly once, apart from that padding or cutting (and padding inside the
        trained steps). The next iteration yields this rank's part of the remainder from
        its start; ``len(self)`` and ``plan()`` describe the remainder until ``set_epoch``
        selects another epoch, which plans as usual at this world. Every rank computes the
        same remainder from any rank's state. Resumed epochs may be saved and resumed at
        yet another world.

        Raises ``ValueError`` for state saved with other sizes, labels or arguments (naming
        the fields that differ; only ``num_replicas`` and ``batch_size`` may change), and,
        mid-epoch, for a change of world or batch size under ``kind="dynamic"`` or a
        node-partitioned shuffle (``local``, ``partial``): those resume at the saved world,
        or at any world from a state saved at an epoch boundary.
        """
        resumed = load_state(state, self.scheduler, self.scheduler.digest, _STATE)
        self._resume_at(resumed.epoch, resumed.history, resumed.plan, resumed.position)

    def _resume_at(
        self, epoch: int, history: tuple[Segment, ...], plan: EpochPlan | None, start: int
    ) -> None:
        resumed = None if plan is None else (history, plan)
        count = self._unit_count(resumed)
        if not 0 <= start <= count:
            raise ValueError(f"state_dict progress={start} is outside this epoch ({count})")
        self.epoch = int(epoch)
        self._resumed = resumed
        self._start = self._progress = int(start)

    def _completed_steps(self) -> int:
        """Steps of the current plan whose samples this rank has all yielded."""
        raise NotImplementedError

    def _planned(self) -> bool:
        """Whether iteration follows ``plan()`` (else the dynamic session's windows)."""
        return self._session is None or self._resumed is not None

    def _begin(self) -> int:
        start, self._start = self._start, 0
        self._progress = start
        return start

    def _local_batches(self, start_step: int) -> Iterator[np.ndarray]:
        """This rank's local batch at every step from ``start_step``: from the plan, or
        window by window from the coordinator with ``kind="dynamic"``."""
        if self._planned():
            plan = self.plan()
            for step in range(start_step, plan.num_steps):
                yield plan.local(step, self.rank)
            return
        if start_step == 0:
            self._weights = {}
        for step, indices, weight in self._session.steps(self.epoch, start_step):
            self._weights[step] = weight
            yield indices

    def _unit_count(self, resumed: _Resumed | None) -> int:
        """What an iteration of the current epoch yields in all, with ``resumed`` as the
        elastic state: samples or batches."""
        raise NotImplementedError


class DistributedSampler(_ScheduledSampler, Sampler[int]):
    """Drop-in for ``torch.utils.data.DistributedSampler`` that balances every step.

    Guarantees: every rank yields ``len(self)`` indices per epoch, step after step with
    ``batch_size // num_replicas`` per step (fewer in a trailing partial step, equally on
    every rank); over all ranks every sample appears exactly once per epoch, except torch's
    padding (``drop_last=False``: repeats from the start of the epoch order) or dropping
    (``drop_last=True``). Equal arguments give identical indices in every process.

    Args beyond torch's: ``batch_size`` (global batch, a multiple of ``num_replicas``;
    without it no balancing happens), ``kind`` (``"static"``, ``"guided"`` or ``"dynamic"``:
    re-balanced from measured times by the coordinator; ``window``, ``port`` and
    ``timeout`` go with it), ``exact`` (``False``: pool balancing, which changes step
    composition), ``sizes`` (one number per sample; otherwise read from the data set),
    ``cost`` (``"linear"``, ``"quadratic"`` or a ``CostModel``). ``shuffle`` also takes a
    policy name (``"global"``, ``"local"``, ``"block"``, ``"stratified"``, ``"none"``) or a
    ``ShufflePolicy`` (e.g.
    ``ShufflePolicy.partial(q=0.1)``); ``groups`` (node id per rank, default from
    ``LOCAL_WORLD_SIZE`` for partitioned policies), ``partitions`` (index list per node) and
    ``labels`` (for ``stratified`` and ``label_skew``) go with them.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: Any = True,
        seed: int = 0,
        drop_last: bool = False,
        batch_size: int | None = None,
        kind: str = "static",
        sizes: Any = None,
        cost: Any = None,
        exact: bool = True,
        groups: Sequence[Any] | None = None,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
        variable_batch: bool = False,
        window: int = 16,
        min_batch: int | None = None,
        max_batch: int | None = None,
        port: int | None = None,
        timeout: float = 10.0,
    ) -> None:
        if variable_batch:
            raise ValueError(
                "variable_batch=True changes local batch sizes, which a DataLoader's fixed "
                "batch_size cannot follow; use DistributedBatchSampler (batch_sampler=...)"
            )
        super().__init__(
            dataset,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            batch_size,
            kind,
            sizes,
            cost,
            exact,
            groups,
            labels,
            partitions,
            dict(
                variable_batch=variable_batch,
                window=window,
                min_batch=min_batch,
                max_batch=max_batch,
                port=port,
                timeout=timeout,
            ),
        )

    def __iter__(self) -> Iterator[int]:
        start = self._begin()
        if self._planned():
            indices = self.plan().rank_indices(self.rank)
            for index in indices[start:].tolist():
                self._progress += 1
                yield index
            return
        # Dynamic plans keep equal counts here, so a sample position maps to its step.
        per_step = self.batch_size // self.num_replicas  # type: ignore[operator]
        skip = start % per_step
        for batch in self._local_batches(start // per_step):
            for index in batch[skip:].tolist():
                self._progress += 1
                yield index
            skip = 0

    def __len__(self) -> int:
        """Indices one iteration of the current epoch yields: torch's ``num_samples``, or
        after an elastic load this rank's share of the epoch's remainder."""
        return self._unit_count(self._resumed)

    def _unit_count(self, resumed: _Resumed | None) -> int:
        if resumed is None:
            return self.num_samples
        return int(resumed[1].counts[:, self.rank].sum())

    def _completed_steps(self) -> int:
        if self._resumed is not None:
            counts = self._resumed[1].counts[:, self.rank]
        else:
            counts = np.asarray(self.scheduler.step_counts(), dtype=np.int64)
        return int(np.searchsorted(np.cumsum(counts), self._progress, side="right"))


class DistributedBatchSampler(_ScheduledSampler, Sampler[list[int]]):
    """Yields this rank's local batch (a list of indices) for every step of the epoch.

    Use as ``DataLoader(dataset, batch_sampler=...)``. Same arguments and guarantees as
    ``DistributedSampler`` except that ``batch_size`` (the global batch) is required;
    ``len(self)`` is the number of steps, equal on every rank.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: Any = True,
        seed: int = 0,
        drop_last: bool = False,
        kind: str = "static",
        sizes: Any = None,
        cost: Any = None,
        exact: bool = True,
        groups: Sequence[Any] | None = None,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
        variable_batch: bool = False,
        window: int = 16,
        min_batch: int | None = None,
        max_batch: int | None = None,
        port: int | None = None,
        timeout: float = 10.0,
    ) -> None:
        if batch_size is None:
            raise ValueError("batch_size (the global batch over all ranks) is required")
        super().__init__(
            dataset,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            batch_size,
            kind,
            sizes,
            cost,
            exact,
            groups,
            labels,
            partitions,
            dict(
                variable_batch=variable_batch,
                window=window,
                min_batch=min_batch,
                max_batch=max_batch,
                port=port,
                timeout=timeout,
            ),
        )

    def __iter__(self) -> Iterator[list[int]]:
        start = self._begin()
        for batch in self._local_batches(start):
            self._progress += 1
            yield batch.tolist()

    def __len__(self) -> int:
        """Batches one iteration of the current epoch yields, equal on every rank: the
        epoch's steps, or after an elastic load the steps of its remainder."""
        return self._unit_count(self._resumed)

    def _unit_count(self, resumed: _Resumed | None) -> int:
        return self.scheduler.num_steps() if resumed is None else resumed[1].num_steps

    def _completed_steps(self) -> int:
        return self._progress
