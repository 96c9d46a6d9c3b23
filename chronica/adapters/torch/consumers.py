"""Who iterates a chronica sampler, and how far its training loop has got.

A sampler learns who iterates it from the call stack at the start of an iteration
(``consumers``): a ``DataLoader``'s iterator, torch's ``BatchSampler``, accelerate's shard,
Lightning's wrappers. Two things follow from it:

* the mistakes that would silently change the plan fail loudly (``check_consumers``);
* a ``DataLoader`` with workers asks its sampler for indices ahead of the training loop
  (``prefetch_factor x num_workers`` batches), so the sampler's own position runs ahead of
  training. ``Delivery`` records the loader iterator that asks and where the sampler
  started; the loop has then received ``_num_yielded`` batches of that iteration (torch
  counts them as it hands them out), and ``advanced`` turns that count into a position of
  the plan. torchdata's ``StatefulDataLoader`` keeps its own books (it snapshots the
  sampler next to every batch it fetches), so it is left alone.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from torch.utils.data.dataloader import _BaseDataLoaderIter
from torch.utils.data.distributed import DistributedSampler as _TorchDistributedSampler

__all__ = ["Delivery", "advanced", "check_consumers", "consumers", "prefetching_loader"]

# How many frames above a sampler's iteration ``consumers`` looks at: enough for
# DataLoader -> accelerate's shard -> torch's BatchSampler -> the sampler, and Lightning's
# sampler wrapper -> its data set wrapper -> the sampler.
_CONSUMER_FRAMES = 6


def consumers(sampler: Any, depth: int = 3) -> Iterator[Any]:
    """The objects (``self`` of the calling frames) that iterate ``sampler``, nearest first,
    ``depth`` frames above this call (the frame that asked the sampler's generator for more).

    Args:
        sampler: the sampler being iterated (skipped where it is its own caller).
        depth: frames between this call and the first consumer's.
    """
    frame: FrameType | None = sys._getframe(depth)
    for _ in range(_CONSUMER_FRAMES):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        frame = frame.f_back
        if owner is not None and owner is not sampler:
            yield owner


def prefetching_loader(owner: Any) -> bool:
    """Whether ``owner`` is a ``DataLoader`` iterator whose workers fetch ahead of the loop
    and that keeps no books of its own (torchdata's ``StatefulDataLoader`` does).

    Args:
        owner: a consumer found by ``consumers``.
    """
    return (
        isinstance(owner, _BaseDataLoaderIter)
        and getattr(owner, "_num_workers", 0) > 0
        and not hasattr(owner, "state_dict")
    )


def check_consumers(
    sampler: Any, owners: Sequence[Any], batch_size: int | None, global_batch: int | None
) -> None:
    """Raise ``ValueError``, naming the fix, when an object iterating ``sampler`` would
    silently change its plan: a batch sampler whose batches straddle or merge steps
    (``batch_size`` is the local batch they must fit), or a second sharding (accelerate's
    ``BatchSamplerShard``, a foreign ``DistributedSampler``).

    Args:
        sampler: chronica's sampler.
        owners: what ``consumers`` found.
        batch_size: the local batch per step, or ``None`` (nothing to fit).
        global_batch: the global batch, for the message.
    """
    world = sampler.num_replicas
    for owner in owners:
        if getattr(owner, "sampler", None) is sampler and batch_size is not None:
            size = getattr(owner, "batch_size", None)
            if isinstance(size, int) and (size > batch_size or batch_size % size):
                raise ValueError(
                    f"the DataLoader's batch_size={size} does not fit chronica's local batch "
                    f"of {batch_size} samples per step (batch_size={global_batch} is the "
                    f"global batch over {world} ranks): its batches would "
                    f"{'merge' if size > batch_size else 'straddle'} balanced steps; use "
                    f"DataLoader(batch_size={batch_size}) (or a divisor of it for "
                    "micro-batches), or DistributedBatchSampler as batch_sampler="
                )
        processes = getattr(owner, "num_processes", None)
        foreign = isinstance(owner, _TorchDistributedSampler) and not hasattr(owner, "stream")
        if (isinstance(processes, int) and processes > 1) or (
            foreign and getattr(owner, "num_replicas", 1) > 1
        ):
            raise ValueError(
                f"{type(owner).__module__}.{type(owner).__name__} shards the batches of "
                f"chronica's {type(sampler).__name__} a second time, so every rank would "
                "train a fraction of its samples. With accelerate, prepare the loader with "
                "chronica.torch.hf.prepare(accelerator, ...) (or call "
                "chronica.torch.hf.unshard(loader) on the prepared loader); with the "
                "transformers Trainer use chronica.torch.hf.Trainer; with Lightning keep "
                "chronica's sampler as it is (it is a torch DistributedSampler) or pass "
                "Trainer(use_distributed_sampler=False)"
            )


class Delivery:
    """One iteration of a sampler by a prefetching ``DataLoader`` iterator: where the
    sampler started (``start``, a ``(step, offset)`` position of its plan), how many of the
    sampler's units one loader batch holds (``per_batch``), and whether the sampler has
    handed out its whole epoch (``fetched_all``).

    Args:
        loader: the ``DataLoader`` iterator (held weakly: it owns the worker processes).
        start: the sampler's position when the iteration began.
        per_batch: units (samples, or batches of a batch sampler) per loader batch.

    Example::

        delivery = Delivery(loader_iterator, start=(0, 0), per_batch=8)
        delivery.received()  # batches the loop has received so far, or None
    """

    def __init__(self, loader: Any, start: tuple[int, int], per_batch: int) -> None:
        self._loader = weakref.ref(loader)
        self.start = start
        self.per_batch = per_batch
        self.fetched_all = False

    def __repr__(self) -> str:
        return (
            f"Delivery(start={self.start}, per_batch={self.per_batch}, "
            f"received={self.received()}, fetched_all={self.fetched_all})"
        )

    def received(self) -> int | None:
        """Batches the training loop has received in this iteration; ``None`` once the
        loader iterator is gone (its count went with it)."""
        loader = self._loader()
        return None if loader is None else int(loader._num_yielded)


def advanced(start: tuple[int, int], units: Sequence[int], count: int) -> tuple[int, int]:
    """The position ``count`` units after ``start``, where step ``s`` holds ``units[s]``
    units: ``(step, offset)``, a completed step moving on to ``(step + 1, 0)``.

    Args:
        start: ``(step, offset)`` to count from.
        units: the units of every step.
        count: units to move on, ``>= 0``.

    Example::

        >>> advanced((0, 1), [4, 4, 2], 5)
        (1, 2)
    """
    step, offset = start
    while count > 0 and step < len(units):
        left = int(units[step]) - offset
        if count < left:
            return step, offset + count
        count -= left
        step, offset = step + 1, 0
    return step, offset
