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

import functools
import inspect
import logging
import operator
import sys
import warnings
from collections.abc import Iterator, Sequence
from types import FrameType, FunctionType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler as _TorchDistributedSampler

from chronica.adapters.hf import arrow_sizes, size_columns
from chronica.adapters.torch.packed import PackedDataset, collate_packed, packed_indices
from chronica.core import ScheduleConfig, Scheduler, resolve_sizes
from chronica.core.sizes import defines_sizeof
from chronica.runtime import Agreement, DynamicOptions
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

# How many frames above a sampler's iteration ``_check_consumers`` looks at: enough for
# DataLoader -> accelerate's shard -> torch's BatchSampler -> the sampler, and Lightning's
# sampler wrapper -> its data set wrapper -> the sampler.
_CONSUMER_FRAMES = 6


class Dataset(_TorchDataset):
    """A ``torch.utils.data.Dataset`` whose samples can say how big they are.

    Override ``__sizeof__(self, index)`` to return the relative size of sample ``index``
    (frames, tokens, seconds); chronica calls it once per sample when a sampler is built.
    The default makes every sample size 1. Called without an index it is Python's usual
    ``__sizeof__``, so ``sys.getsizeof`` keeps working, also for a subclass whose override
    takes the index only (``def __sizeof__(self, index)``, as in the quick start): such an
    override is wrapped when the subclass is defined.

    Example::

        class Clips(chronica.torch.utils.data.Dataset):
            def __sizeof__(self, index):
                return self.frames[index]
    """

    def __sizeof__(self, index: int | None = None) -> int:
        if index is None:
            return object.__sizeof__(self)
        return 1

    __sizeof__.__chronica_default__ = True  # type: ignore[attr-defined]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        method = vars(cls).get("__sizeof__")
        if isinstance(method, FunctionType) and not hasattr(method, "__chronica_wrapped__"):
            cls.__sizeof__ = _memory_size_without_index(method)  # type: ignore[method-assign]


def _memory_size_without_index(method: Any) -> Any:
    """``method`` (a ``__sizeof__(self, index)``) that, called without an index as
    ``sys.getsizeof`` does, gives the object's memory size instead of a ``TypeError``."""

    @functools.wraps(method)
    def __sizeof__(self: Any, index: int | None = None) -> Any:
        if index is None:
            return object.__sizeof__(self)
        return method(self, index)

    __sizeof__.__chronica_wrapped__ = True  # type: ignore[attr-defined]
    return __sizeof__


def _check_sizes_source(dataset: Any, sizes: Any, warn_missing: bool) -> None:
    """Warn, naming the fix, when a balancing sampler's sizes would silently be one per
    sample, or when the data set's ``__sizeof__(self, index)`` breaks ``sys.getsizeof``."""
    if defines_sizeof(dataset):
        method = type(dataset).__sizeof__
        if not hasattr(method, "__chronica_wrapped__") and not _index_optional(method):
            warnings.warn(
                f"{type(dataset).__name__}.__sizeof__(self, index) makes sys.getsizeof("
                "dataset) raise a TypeError (Python calls it without an index); write "
                "def __sizeof__(self, index=None) returning object.__sizeof__(self) for "
                "None, or subclass chronica.torch.utils.data.Dataset, which does that",
                stacklevel=4,
            )
        return
    if sizes is not None or getattr(dataset, "sizes", None) is not None or not warn_missing:
        return
    columns = size_columns(dataset)
    hint = f" (a column name: one of {columns})" if columns else ""
    warnings.warn(
        f"chronica: no sample sizes for {type(dataset).__name__}, so every sample weighs 1: "
        "nothing can be balanced and stats() reports a perfect balance that is not real. "
        f"Pass sizes= (one number per sample{hint}), give the data set a sizes attribute, "
        "or define __sizeof__(self, index)",
        stacklevel=4,
    )


def _index_optional(method: Any) -> bool:
    """Whether ``method(self)``, without an index, is a valid call."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    params = list(signature.parameters.values())[1:]
    return (
        not params
        or params[0].default is not inspect.Parameter.empty
        or params[0].kind
        in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        )
    )


def _torch_world() -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "num_replicas and rank were not given and torch.distributed is not "
            "initialized; call dist.init_process_group(...) first or pass both (under "
            "Lightning, build the sampler in train_dataloader(), where the group exists; "
            "under accelerate or the transformers Trainer, after Accelerator() or "
            "TrainingArguments(...))"
        )
    return dist.get_world_size(), dist.get_rank()


def _gloo_agreement(scheduler: Scheduler) -> Agreement | None:
    """The ranks' ``Agreement``, its sums all-reduced over a gloo group of their own (the
    key it draws never leaves torch.distributed); ``None`` without a process group (every
    window is then the static plan)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    config = scheduler.config
    if dist.get_world_size() != config.num_replicas:
        raise ValueError(
            f"num_replicas={config.num_replicas} differs from the process group's world size "
            f"{dist.get_world_size()}; kind='dynamic' needs one rank per replica"
        )
    group = dist.new_group(backend="gloo")

    def total(vector: np.ndarray) -> np.ndarray:
        summed = torch.from_numpy(np.array(vector, np.int64))
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        return summed.numpy()

    return Agreement(total, dist.get_rank(), config.num_replicas)


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
            detect=_torch_world,
            needs_step=needs_step,
        )
        self._check_config(cfg)
        missing = (
            None if cfg.packing is None else "packing= needs every document's length in tokens"
        )
        sizes = arrow_sizes(dataset, sizes)
        if cfg.batch_size is not None or cfg.packing is not None:
            _check_sizes_source(dataset, sizes, missing is None)
        self.stream = open_stream(
            resolve_sizes(dataset, sizes, missing),
            cfg,
            rank,
            labels=labels,
            partitions=partitions,
            dynamic=dynamic,
            agree=_gloo_agreement,
            names=_NAMES,
        )
        self.dataset = dataset
        self.global_batch_size = cfg.batch_size
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

    def _check_consumers(self, batch_size: int | None) -> None:
        """Fail loudly when the objects iterating this sampler (found on the call stack at
        the start of an iteration) would silently change its plan: a batch sampler whose
        batches straddle or merge steps (``batch_size`` is the size that fits), or a second
        sharding (accelerate's ``BatchSamplerShard``, a foreign ``DistributedSampler``)."""
        # The frame that asked the sampler's generator for more, then its callers.
        frame: FrameType | None = sys._getframe(2)
        for _ in range(_CONSUMER_FRAMES):
            if frame is None:
                return
            owner = frame.f_locals.get("self")
            frame = frame.f_back
            if owner is None or owner is self:
                continue
            if getattr(owner, "sampler", None) is self and batch_size is not None:
                size = getattr(owner, "batch_size", None)
                if isinstance(size, int) and (size > batch_size or batch_size % size):
                    raise ValueError(
                        f"the DataLoader's batch_size={size} does not fit chronica's local batch "
                        f"of {batch_size} samples per step (batch_size={self.global_batch_size} "
                        f"is the global batch over {self.num_replicas} ranks): its batches would "
                        f"{'merge' if size > batch_size else 'straddle'} balanced steps; use "
                        f"DataLoader(batch_size={batch_size}) (or a divisor of it for "
                        f"micro-batches), or DistributedBatchSampler as batch_sampler="
                    )
            processes = getattr(owner, "num_processes", None)
            foreign = isinstance(owner, _TorchDistributedSampler) and not isinstance(
                owner, _ScheduledSampler
            )
            if (isinstance(processes, int) and processes > 1) or (
                foreign and getattr(owner, "num_replicas", 1) > 1
            ):
                raise ValueError(
                    f"{type(owner).__module__}.{type(owner).__name__} shards the batches of "
                    f"chronica's {type(self).__name__} a second time, so every rank would "
                    "train a fraction of its samples. With accelerate, prepare the loader with "
                    "chronica.torch.hf.prepare(accelerator, ...) (or call "
                    "chronica.torch.hf.unshard(loader) on the prepared loader); with the "
                    "transformers Trainer use chronica.torch.hf.Trainer; with Lightning keep "
                    "chronica's sampler as it is (it is a torch DistributedSampler) or pass "
                    "Trainer(use_distributed_sampler=False)"
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
        self._check_consumers(self.local_batch_size)
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

    @property
    def batch_size(self) -> int | None:
        """Samples in every yielded batch but a trailing partial one (torch's meaning);
        ``None`` when they vary. See ``local_batch_size``."""
        return self.local_batch_size

    def __iter__(self) -> Iterator[list[int]]:
        self._check_consumers(None)
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
