"""Drop-in replacements for ``torch.utils.data.Dataset`` and ``DistributedSampler``.

``DistributedSampler`` keeps torch's contract (``len``, padding by wrapping, ``drop_last``,
``set_epoch``, a ``ValueError`` for a bad rank) and adds one argument that matters:
``batch_size``, the *global* batch. With it, every step's samples are split between ranks
so the slowest rank's predicted cost is as low as it can be. Use ``batch_size //
num_replicas`` as the ``DataLoader``'s batch size.

Both samplers say they are already distributed the way the training libraries look for it:
``DistributedSampler`` is a ``torch.utils.data.DistributedSampler`` (Lightning keeps it
instead of wrapping it again) and ``DistributedBatchSampler`` has torch's batch sampler
attributes (``batch_size`` per yielded batch, ``drop_last``, ``sampler``, whose ``set_epoch``
is the batch sampler's). The mistakes that would silently undo the balance fail loudly,
naming the fix: a ``DataLoader`` batch size other than the local batch, a second sharding by
another library's wrapper (accelerate's ``prepare``, a foreign ``DistributedSampler``),
Lightning re-instantiating a batch sampler; sizes that default to one per sample are a
warning.

Both samplers are faces of a ``chronica.runtime.RankStream``; this module holds only what
is torch's: the world from ``torch.distributed``, the ranks' agreement over a gloo group,
and torch's ``Sampler`` protocol.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import Sampler
from torch.utils.data.dataloader import _BaseDataLoaderIter
from torch.utils.data.distributed import DistributedSampler as _TorchDistributedSampler

from chronica.adapters.hf import arrow_sizes
from chronica.adapters.torch.consumers import (
    Delivery,
    advanced,
    check_consumers,
    consumers,
    prefetching_loader,
)
from chronica.adapters.torch.dataset import Dataset, check_sizes_source
from chronica.adapters.torch.packed import PackedDataset, collate_packed, packed_indices
from chronica.adapters.torch.packed_length import EMPTY, PackedLength
from chronica.adapters.torch.world import gloo_agreement, torch_world
from chronica.core import ScheduleConfig, resolve_sizes
from chronica.runtime import DynamicOptions
from chronica.runtime.face import StreamFace
from chronica.runtime.request import given_options, open_stream, plan_face, plan_request
from chronica.runtime.stream import state_format

__all__ = [
    "Dataset",
    "DistributedBatchSampler",
    "DistributedSampler",
    "PackedDataset",
    "collate_packed",
]

logger = logging.getLogger("chronica")

_NAMES = state_format("sampler", "batch_size")


def _loader_batch(loader: Any) -> int:
    """Samples per batch of ``loader`` (a ``DataLoader`` iterator over a sample-level
    sampler, or ``None``): its ``BatchSampler``'s batch size, else 1."""
    size = getattr(getattr(loader, "_index_sampler", None), "batch_size", None)
    return size if isinstance(size, int) and size > 0 else 1


class _ScheduledSampler(StreamFace):
    """What both samplers share: building the stream from torch-style arguments, and the
    guards against what would silently undo the plan."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        num_replicas: int | None,
        rank: int | None,
        options: dict[str, Any],
        *,
        sizes: Any,
        labels: Any,
        partitions: Sequence[Any] | None,
        config: ScheduleConfig | None,
        dynamic: DynamicOptions | None,
        needs_step: bool,
    ) -> None:
        if isinstance(dataset, Sampler):
            raise ValueError(
                f"dataset is a {type(dataset).__name__} (a sampler): something rebuilt "
                f"chronica's {type(self).__name__} around its own distributed sampler. "
                "Lightning does this to batch samplers: pass "
                "Trainer(use_distributed_sampler=False), chronica's batch sampler already "
                "shards, shuffles and follows set_epoch"
            )
        cfg, rank = plan_request(
            options,
            batch_size=batch_size,
            num_replicas=num_replicas,
            rank=rank,
            face=type(self).__name__,
            config=config,
            dynamic=dynamic,
            detect=torch_world,
            needs_step=needs_step,
        )
        self._check_config(cfg)
        missing = (
            None if cfg.packing is None else "packing= needs every document's length in tokens"
        )
        sizes = arrow_sizes(dataset, sizes)
        if cfg.batch_size is not None or cfg.packing is not None:
            check_sizes_source(dataset, sizes, missing is None)
        self.stream = open_stream(
            resolve_sizes(dataset, sizes, missing),
            cfg,
            rank,
            labels=labels,
            partitions=partitions,
            dynamic=dynamic,
            agree=gloo_agreement,
            names=_NAMES,
        )
        self.dataset = dataset
        self.global_batch_size = cfg.batch_size
        self._epoch_ended = False  # an iteration ran to the end of the current epoch
        self._delivery: Delivery | None = None
        self.shuffle = cfg.shuffle
        self.seed = cfg.seed
        self.drop_last = cfg.drop_last
        if cfg.batch_size is None and cfg.packing is None:
            logger.warning(
                "chronica: batch_size (the global batch) was not given, so steps cannot be "
                "balanced; the sampler splits indices like torch's DistributedSampler"
            )

    def _check_config(self, config: ScheduleConfig) -> None:
        """Refuse what this face cannot follow (before any data is read)."""

    @property
    def local_batch_size(self) -> int | None:
        """Samples of every full step on this rank (``global_batch_size // num_replicas``);
        ``None`` when it varies (``variable_batch=True``, ``packing=``) or nothing is
        balanced (no ``batch_size``)."""
        config = self.stream.config
        if config.batch_size is None or config.variable_batch or config.packing is not None:
            return None
        return config.batch_size // config.num_replicas

    def _begin_iteration(self, batch_size: int | None) -> Any:
        """Start an iteration: fail loudly when the objects iterating this sampler (found
        on the call stack) would silently change its plan (``check_consumers``) or when the
        epoch is iterated again without ``set_epoch``/``set_state`` after it ended; returns
        the ``DataLoader`` iterator that prefetches from this sampler, if any (its count of
        batches handed to the loop is then the position of ``get_state``).

        Args:
            batch_size: the local batch per step that a ``DataLoader``'s batches must fit.
        """
        owners = list(consumers(self, depth=3))
        check_consumers(self, owners, batch_size, self.global_batch_size)
        if self._epoch_ended:
            loader = any(isinstance(owner, _BaseDataLoaderIter) for owner in owners)
            what = (
                f"chronica's {type(self).__name__} is iterated again at epoch {self.epoch} "
                "without set_epoch or set_state since that epoch ended, so it would repeat "
                "the same order; call sampler.set_epoch(epoch) before every epoch (with "
                "the transformers Trainer and a get_train_dataloader of your own, return "
                "the loader through self.accelerator.prepare(...), which passes the epoch "
                "on, or call set_epoch from a TrainerCallback's on_epoch_begin)"
            )
            if loader:
                raise RuntimeError(what)
            logger.warning("chronica: %s", what)
        self._epoch_ended = False
        self._delivery = None
        return next((owner for owner in owners if prefetching_loader(owner)), None)

    def _delivered(self, loader: Any, start: tuple[int, int], per_batch: int) -> None:
        """Record that ``loader`` (a prefetching ``DataLoader`` iterator, or ``None``)
        iterates from ``start``, ``per_batch`` units in every batch it hands out."""
        if loader is not None:
            self._delivery = Delivery(loader, start, per_batch)

    def _received_position(self) -> tuple[int, int] | None:
        """``(step, offset)`` up to which the training loop has received this iteration's
        batches from a prefetching ``DataLoader``; ``None`` when the sampler's own position
        is what the loop received (no such loader, or the epoch's batches all went out and
        the loader is gone). Raises ``RuntimeError`` when that loader was dropped mid-epoch:
        how many of its prefetched batches were trained is then unknown."""
        delivery = self._delivery
        if delivery is None:
            return None
        received = delivery.received()
        if received is None:
            if delivery.fetched_all:
                return None
            raise RuntimeError(
                "the DataLoader with workers that iterated this sampler was dropped mid-epoch, "
                "so how many of the batches its workers prefetched reached training is "
                "unknown; take state_dict() while the loader is being iterated (inside the "
                "training loop, after the batch you trained), or use torchdata's "
                "StatefulDataLoader and save its state_dict()"
            )
        return advanced(delivery.start, self._units_per_step(), received * delivery.per_batch)

    def _units_per_step(self) -> Sequence[int]:
        """What one loader batch counts in, at every step of the current plan."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate next; call it before each epoch, as with torch.
        Selecting the current epoch again keeps a position loaded by ``set_state``.

        Args:
            epoch: the epoch, an int >= 0.
        """
        super().set_epoch(epoch)
        self._epoch_ended = False
        self._delivery = None

    def get_state(self) -> dict[str, Any]:
        """Resumable position, a small JSON-ready dict that does not depend on the rank.
        Under a ``DataLoader`` with workers, which asks for indices ahead of the training
        loop, it is the position of the last batch the loop received, not of the
        prefetch."""
        state = super().get_state()
        position = self._received_position()
        if position is not None:
            state["step"], state["offset"] = position
        return state

    def set_state(self, state: Any) -> None:
        """Continue from ``state`` (``get_state`` of any rank, from any adapter).

        Args:
            state: what ``get_state`` returned (any rank's, any adapter's).
        """
        super().set_state(state)
        self._epoch_ended = False
        self._delivery = None

    @property
    def num_samples(self) -> int:
        """Samples this rank receives per epoch (torch's ``num_samples``)."""
        return self.scheduler.samples_per_replica()

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        """torch's name for ``get_state``: resumable position, a small JSON-ready dict."""
        return self.get_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """torch's name for ``set_state``: continue from ``state`` (see ``set_state``)."""
        self.set_state(state)


@plan_face
class DistributedSampler(_ScheduledSampler, _TorchDistributedSampler):
    """Drop-in for ``torch.utils.data.DistributedSampler`` that balances every step.

    Guarantees: every rank yields ``len(self)`` indices per epoch, step after step with
    ``batch_size // num_replicas`` per step (fewer in a trailing partial step, equally on
    every rank); over all ranks every sample appears exactly once per epoch, except torch's
    padding (``drop_last=False``: repeats from the start of the epoch order) or dropping
    (``drop_last=True``). Equal arguments give identical indices in every process.

    It is a ``torch.utils.data.DistributedSampler`` (Lightning keeps it rather than wrapping
    it a second time); ``batch_size`` and ``global_batch_size`` are the global batch,
    ``local_batch_size`` what the ``DataLoader`` must take. Iterating it through a batch
    sampler of another size, or through a second sharding, raises ``ValueError``.

    Args:
        dataset: the data set; sizes are read from it unless ``sizes`` is given.
        num_replicas: the world size (default: ``torch.distributed``'s).
        rank: this process's rank (default: ``torch.distributed``'s).
        shuffle: as torch's, or a shuffle policy (see ``shuffle`` under plan options).
        seed: as torch's: the seed of every random choice of the plan.
        drop_last: as torch's: drop the tail instead of padding it with repeats.
        batch_size: the global batch over all ranks, a multiple of ``num_replicas``;
            without it nothing is balanced (torch's split).
        sizes: one number per sample (tokens, frames); a column name of a Hugging Face
            ``datasets.Dataset`` given as ``dataset`` (numbers, or lists and strings whose
            lengths are the sizes), a ``Column`` of one or an Arrow array, all read without
            a Python loop; default the data set's ``sizes`` or ``__sizeof__(index)``.
        labels: one class per sample (``shuffle="stratified"``, ``label_skew``).
        partitions: one index list per node (``shuffle="local"``/``"partial"``).
        config: a whole ``chronica.ScheduleConfig`` instead of ``batch_size`` and the plan
            options.
        dynamic: ``kind="dynamic"``: where rank 0's coordinator listens and how long ranks
            wait for it (a ``chronica.runtime.DynamicOptions``).
        options: the plan options below.

    Example::

        sampler = DistributedSampler(dataset, batch_size=256, sizes=lengths, cost="quadratic")
        loader = DataLoader(dataset, batch_size=sampler.local_batch_size, sampler=sampler)
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
        *,
        sizes: Any = None,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
        config: ScheduleConfig | None = None,
        dynamic: DynamicOptions | None = None,
        **options: Any,
    ) -> None:
        options.update(given_options(shuffle=shuffle, seed=seed, drop_last=drop_last))
        super().__init__(
            dataset,
            batch_size,
            num_replicas,
            rank,
            options,
            sizes=sizes,
            labels=labels,
            partitions=partitions,
            config=config,
            dynamic=dynamic,
            needs_step=False,
        )
        self._taking: tuple[Iterator[int], int] | None = None  # the step being handed out

    def _check_config(self, config: ScheduleConfig) -> None:
        if config.packing is not None:
            raise ValueError(
                "packing= cuts steps into micro-batches of packed documents, which a "
                "DataLoader's fixed batch_size cannot follow; use DistributedBatchSampler "
                "(batch_sampler=...) with PackedDataset and collate_packed"
            )
        if config.variable_batch:
            raise ValueError(
                "variable_batch=True changes local batch sizes, which a DataLoader's fixed "
                "batch_size cannot follow; use DistributedBatchSampler (batch_sampler=...)"
            )

    @property
    def batch_size(self) -> int | None:
        """The global batch over all ranks (the ``batch_size`` argument); the
        ``DataLoader``'s batch size is ``local_batch_size``."""
        return self.global_batch_size

    def __iter__(self) -> Iterator[int]:
        loader = self._begin_iteration(self.local_batch_size)
        stream = self.stream
        first = True
        for batch in stream.batches(whole=False):
            if first:
                self._delivered(loader, (batch.step, stream.offset), _loader_batch(loader))
                first = False
            rest = batch.indices[stream.offset :].tolist()
            # The position is counted when asked for (``_count_taken``), not per index: the
            # list iterator knows how many indices the consumer has taken.
            self._taking = (iter(rest), len(rest))
            yield from self._taking[0]
            self._count_taken()
            self._taking = None
        self._epoch_ended = True
        if self._delivery is not None:
            self._delivery.fetched_all = True

    def _units_per_step(self) -> Sequence[int]:
        return self.stream.step_counts().tolist()

    def _count_taken(self) -> None:
        if self._taking is not None:
            indices, size = self._taking
            left = operator.length_hint(indices)
            if size > left:
                self.stream.advance(size - left)
                self._taking = (indices, left)

    def get_state(self) -> dict[str, Any]:
        self._count_taken()
        return super().get_state()

    def set_state(self, state: Any) -> None:
        self._taking = None
        super().set_state(state)

    def __len__(self) -> int:
        """Indices one iteration of the current epoch yields: torch's ``num_samples``, or
        after an elastic ``set_state`` this rank's share of the epoch's remainder."""
        return int(self.stream.step_counts().sum())


@plan_face
class DistributedBatchSampler(_ScheduledSampler, Sampler[list[int]]):
    """Yields this rank's local batch (a list of indices) for every step of the epoch.

    With ``packing=`` (a ``chronica.core.packing.Packing``) it yields micro-batches instead:
    every step's ``num_micro`` micro-batches of this rank, the same count on every rank,
    each a list of ``PackedIndex`` (document index plus where its tokens go); use
    ``DataLoader(PackedDataset(dataset), batch_sampler=..., collate_fn=collate_packed)``
    and ``len(self)`` counts micro-batches. ``batch_size`` is then the documents per step,
    or ``None`` with ``Packing(tokens_per_step=...)``.

    Use as ``DataLoader(dataset, batch_sampler=...)``. Same arguments and guarantees as
    ``DistributedSampler`` except that ``batch_size`` (the global batch) is required and
    ``variable_batch=True`` is allowed (with ``kind="dynamic"``: local batch sizes follow
    measured rank speeds, the global batch unchanged); ``len(self)`` is the number of
    steps, equal on every rank.

    Its attributes mean what torch's ``BatchSampler``'s do: ``batch_size`` is the size of
    the batches it yields (the local batch, ``global_batch_size // num_replicas``; a
    trailing partial step yields fewer; ``None`` when sizes vary: ``variable_batch=True`` or
    ``packing=``), ``drop_last`` its argument, and ``sampler`` this rank's indices in batch
    order (iterating it iterates this batch sampler; its ``set_epoch`` is this one's, so
    libraries that call ``batch_sampler.sampler.set_epoch`` reach it). ``global_batch_size``
    is the ``batch_size`` argument.

    Args:
        dataset: the data set; sizes are read from it unless ``sizes`` is given.
        batch_size: the global batch over all ranks (required, unless ``config`` holds it
            or ``Packing(tokens_per_step=...)`` sets a token budget).
        num_replicas: the world size (default: ``torch.distributed``'s).
        rank: this process's rank (default: ``torch.distributed``'s).
        shuffle: as torch's, or a shuffle policy (see ``shuffle`` under plan options).
        seed: the seed of every random choice of the plan.
        drop_last: drop the tail instead of padding it with repeats.
        sizes: one number per sample, as for ``DistributedSampler``.
        labels: one class per sample (``shuffle="stratified"``, ``label_skew``).
        partitions: one index list per node (``shuffle="local"``/``"partial"``).
        config: a whole ``chronica.ScheduleConfig`` instead of ``batch_size`` and the plan
            options.
        dynamic: ``kind="dynamic"``: the transport to rank 0's coordinator
            (``chronica.runtime.DynamicOptions``).
        options: the plan options below.

    Example::

        batches = DistributedBatchSampler(dataset, 256, sizes=lengths, kind="dynamic")
        loader = DataLoader(dataset, batch_sampler=batches)
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: Any = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        sizes: Any = None,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
        config: ScheduleConfig | None = None,
        dynamic: DynamicOptions | None = None,
        **options: Any,
    ) -> None:
        options.update(given_options(shuffle=shuffle, seed=seed, drop_last=drop_last))
        super().__init__(
            dataset,
            batch_size,
            num_replicas,
            rank,
            options,
            sizes=sizes,
            labels=labels,
            partitions=partitions,
            config=config,
            dynamic=dynamic,
            needs_step=True,
        )
        self.sampler = _BatchIndices(self)
        self._length = PackedLength(self.stream)
        self._padded = 0  # empty micro-batches this iteration put in its last step

    @property
    def batch_size(self) -> int | None:
        """Samples in every yielded batch but a trailing partial one (torch's meaning);
        ``None`` when they vary. See ``local_batch_size``."""
        return self.local_batch_size

    def __iter__(self) -> Iterator[list[int]]:
        loader = self._begin_iteration(None)
        stream = self.stream
        batches = self._packed() if stream.packed else self._steps()
        first = True
        for step, offset, indices in batches:
            if first:
                self._delivered(loader, (step, offset), 1)
                first = False
            yield indices
        self._epoch_ended = True
        if self._delivery is not None:
            self._delivery.fetched_all = True

    def _steps(self) -> Iterator[tuple[int, int, list[int]]]:
        for batch in self.stream.batches():
            yield batch.step, 0, batch.indices.tolist()

    def _packed(self) -> Iterator[tuple[int, int, list[int]]]:
        """Every micro-batch left of the epoch, with the position it starts from; an epoch
        shorter than the promised ``len`` first pads its last step with empty ones."""
        stream = self.stream
        padding = self._length.padding()  # raises before anything is yielded
        last = stream.num_steps - 1
        self._padded = 0
        for batch in stream.batches(whole=False):
            micro = batch.micro
            offset = stream.offset
            extra = padding if batch.step == last and offset == 0 else 0
            count = len(micro) + (padding if batch.step == last else 0)
            self._padded = extra
            for m in range(extra):  # loss weight 0: the step's update is unchanged
                yield batch.step, 0, packed_indices(EMPTY, batch.step, m, count)
            for m in range(offset, len(micro)):
                # Counted before it is handed out: a state taken once the consumer holds
                # the micro-batch resumes with the next one.
                stream.advance(1)
                yield (
                    batch.step,
                    offset,
                    packed_indices(micro[m], batch.step, count - len(micro) + m, count),
                )

    def _units_per_step(self) -> Sequence[int]:
        plan = self.stream.plan()
        if plan.micro is None:
            return [1] * plan.num_steps
        units = plan.micro.num_micro.tolist()
        if units:
            units[-1] += self._padded
        return units

    def _received_position(self) -> tuple[int, int] | None:
        position = super()._received_position()
        if position is None or not self._padded or position[0] != self.stream.num_steps - 1:
            return position
        return position[0], max(0, position[1] - self._padded)  # padding is not trained

    def __len__(self) -> int:
        """Batches one iteration of the current epoch yields, equal on every rank: the
        epoch's steps or, when packed, the micro-batches promised for every epoch when
        ``len`` is first read (see ``chronica.adapters.torch.packed_length``); after an
        elastic ``set_state``, those of the epoch's remainder."""
        if self.stream.packed:
            return self._length.length()
        return self.stream.num_steps


class _BatchIndices(Sampler[int]):
    """``DistributedBatchSampler.sampler``: this rank's indices of the epoch in batch order,
    and the batch sampler's ``set_epoch`` (what torch's ``BatchSampler.sampler`` is to
    libraries that reach a batch sampler's epoch through it)."""

    def __init__(self, owner: DistributedBatchSampler) -> None:
        self._owner = owner

    @property
    def epoch(self) -> int:
        """The epoch the batch sampler iterates."""
        return self._owner.epoch

    def set_epoch(self, epoch: int) -> None:
        """The batch sampler's ``set_epoch``."""
        self._owner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for batch in self._owner:
            yield from (int(i) for i in batch if getattr(i, "length", 1))

    def __len__(self) -> int:
        """This rank's samples (pieces of documents, when packed) in the epoch's plan."""
        return int(self._owner.stream.step_counts().sum())
