"""Drop-in replacements for ``torch.utils.data.Dataset`` and ``DistributedSampler``.

``DistributedSampler`` keeps torch's contract (``len``, padding by wrapping, ``drop_last``,
``set_epoch``, a ``ValueError`` for a bad rank) and adds one argument that matters:
``batch_size``, the *global* batch. With it, every step's samples are split between ranks
so the slowest rank's predicted cost is as low as it can be. Use ``batch_size //
num_replicas`` as the ``DataLoader``'s batch size.

Both samplers are faces of a ``chronica.runtime.RankStream``; this module holds only what
is torch's: the world from ``torch.distributed``, the ranks' agreement over a gloo group,
and torch's ``Sampler`` protocol.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import Sampler

from chronica.adapters.torch.packed import PackedDataset, collate_packed, packed_indices
from chronica.core import ScheduleConfig, Scheduler, resolve_sizes
from chronica.core.packing import Packing
from chronica.runtime import Agreement, DynamicOptions
from chronica.runtime.build import (
    open_stream,
    resolve_world,
    schedule_config,
    scheduling_arguments,
)
from chronica.runtime.face import StreamFace
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


def _torch_world() -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "num_replicas and rank were not given and torch.distributed is not "
            "initialized; call dist.init_process_group(...) first or pass both"
        )
    return dist.get_world_size(), dist.get_rank()


def _gloo_agreement(scheduler: Scheduler) -> Agreement | None:
    """Whether all ranks hold the same positive token, by one all-reduce over a gloo group
    of their own; ``None`` without a process group (each rank then decides alone)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    config = scheduler.config
    if dist.get_world_size() != config.num_replicas:
        raise ValueError(
            f"num_replicas={config.num_replicas} differs from the process group's world size "
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


class _ScheduledSampler(StreamFace):
    """What both samplers share: building the stream from torch-style arguments."""

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        # ``arguments``: the subclass's constructor arguments (its ``locals()``).
        config, dynamic = arguments["config"], arguments["dynamic"]
        num_replicas, rank = arguments["num_replicas"], arguments["rank"]
        dataset = arguments["dataset"]
        world, rank = resolve_world(num_replicas, rank, _torch_world, config=config)
        scheduling = scheduling_arguments(arguments)
        cfg = schedule_config(config, world, arguments["batch_size"], scheduling, dynamic)
        missing = (
            None if cfg.packing is None else "packing= needs every document's length in tokens"
        )
        self.stream = open_stream(
            resolve_sizes(dataset, arguments["sizes"], missing),
            cfg,
            rank,
            labels=arguments["labels"],
            partitions=arguments["partitions"],
            dynamic=dynamic,
            agree=_gloo_agreement,
            names=_NAMES,
        )
        self.dataset = dataset
        self.batch_size = cfg.batch_size
        self.shuffle = cfg.shuffle
        self.seed = cfg.seed
        self.drop_last = cfg.drop_last
        if cfg.batch_size is None and cfg.packing is None:
            logger.warning(
                "chronica: batch_size (the global batch) was not given, so steps cannot be "
                "balanced; the sampler splits indices like torch's DistributedSampler"
            )

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
        """torch's name for ``set_state``: continue from ``state`` (see ``set_state``).

        A ``DataLoader`` with workers prefetches, so a state taken from the sampler during
        training runs ahead of the steps trained by that prefetch."""
        self.set_state(state)


class DistributedSampler(_ScheduledSampler, Sampler[int]):
    """Drop-in for ``torch.utils.data.DistributedSampler`` that balances every step.

    Guarantees: every rank yields ``len(self)`` indices per epoch, step after step with
    ``batch_size // num_replicas`` per step (fewer in a trailing partial step, equally on
    every rank); over all ranks every sample appears exactly once per epoch, except torch's
    padding (``drop_last=False``: repeats from the start of the epoch order) or dropping
    (``drop_last=True``). Equal arguments give identical indices in every process.

    Args beyond torch's: ``batch_size`` (global batch, a multiple of ``num_replicas``;
    without it no balancing happens), ``kind`` (``"static"``, ``"guided"`` or ``"dynamic"``:
    re-balanced from measured times by the coordinator, configured by ``dynamic=``, a
    ``DynamicOptions``), ``exact`` (``False``: pool balancing, which changes step
    composition), ``sizes`` (one number per sample; otherwise read from the data set),
    ``cost`` (``"linear"``, ``"quadratic"`` or a ``CostModel``). ``shuffle`` also takes a
    policy name (``"global"``, ``"local"``, ``"block"``, ``"stratified"``, ``"none"``) or a
    ``ShufflePolicy`` (e.g. ``ShufflePolicy.partial(q=0.1)``); ``groups`` (node id per
    rank, default from ``LOCAL_WORLD_SIZE`` for partitioned policies), ``partitions``
    (index list per node) and ``labels`` (for ``stratified`` and ``label_skew``) go with
    them. ``config``: a whole ``ScheduleConfig`` instead of the scheduling keywords.
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
        *,
        packing: Packing | None = None,
        config: ScheduleConfig | None = None,
        dynamic: DynamicOptions | None = None,
    ) -> None:
        if packing is not None or (config is not None and config.packing is not None):
            raise ValueError(
                "packing= cuts steps into micro-batches of packed documents, which a "
                "DataLoader's fixed batch_size cannot follow; use DistributedBatchSampler "
                "(batch_sampler=...) with PackedDataset and collate_packed"
            )
        if variable_batch or (config is not None and config.variable_batch):
            raise ValueError(
                "variable_batch=True changes local batch sizes, which a DataLoader's fixed "
                "batch_size cannot follow; use DistributedBatchSampler (batch_sampler=...)"
            )
        super().__init__(locals())
        self._taking: tuple[Iterator[int], int] | None = None  # the step being handed out

    def __iter__(self) -> Iterator[int]:
        stream = self.stream
        for batch in stream.batches(whole=False):
            rest = batch.indices[stream.offset :].tolist()
            # The position is counted when asked for (``_count_taken``), not per index: the
            # list iterator knows how many indices the consumer has taken.
            self._taking = (iter(rest), len(rest))
            yield from self._taking[0]
            self._count_taken()
            self._taking = None

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
        kind: str = "static",
        sizes: Any = None,
        cost: Any = None,
        exact: bool = True,
        groups: Sequence[Any] | None = None,
        labels: Any = None,
        partitions: Sequence[Any] | None = None,
        variable_batch: bool = False,
        *,
        packing: Packing | None = None,
        config: ScheduleConfig | None = None,
        dynamic: DynamicOptions | None = None,
    ) -> None:
        budget = packing is not None and packing.tokens_per_step is not None
        if batch_size is None and config is None and not budget:
            raise ValueError("batch_size (the global batch over all ranks) is required")
        super().__init__(locals())
        if self.batch_size is None and self.stream.config.packing is None:
            raise ValueError("config.batch_size (the global batch over all ranks) is required")

    def __iter__(self) -> Iterator[list[int]]:
        stream = self.stream
        if not stream.packed:
            for batch in stream.batches():
                yield batch.indices.tolist()
            return
        for batch in stream.batches(whole=False):
            micro = batch.micro
            for m in range(stream.offset, len(micro)):
                # Counted before it is handed out: a state taken once the consumer holds
                # the micro-batch resumes with the next one.
                stream.advance(1)
                yield packed_indices(micro[m], batch.step, m, len(micro))

    def __len__(self) -> int:
        """Batches one iteration of the current epoch yields, equal on every rank: the
        epoch's steps (micro-batches, when packed), or after an elastic ``set_state`` those
        of its remainder."""
        micro = self.stream.plan().micro
        return self.stream.num_steps if micro is None else int(micro.num_micro.sum())
