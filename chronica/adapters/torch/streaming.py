"""``StreamingDataset``: a sharded stream as a torch ``IterableDataset`` of this rank's
packed, balanced micro-batches, with ``state_dict``/``load_state_dict`` (torchdata's
``StatefulDataLoader`` saves and restores them) and the ranks' collectives over
``torch.distributed``.

Each item is one micro-batch as ``collate_packed`` builds it (``input_ids``,
``position_ids``, ``segment_ids``, ``cu_seqlens``, ``max_seqlen``, ``loss_weight``,
``step``, ``micro``, ``num_micro``, ``last``, ``indices``, ``labels``: a record's own
``labels`` field where it has one), plus ``epoch``; every rank gets
the same number of items per step. The planning (``chronica.runtime.streaming``) runs in a
thread of its own over a dedicated gloo group, so the trainer's collectives never interleave
with it. Use ``DataLoader(dataset, batch_size=None, num_workers=0)``: the engine reads
ahead in its own thread, and worker processes would each read the whole stream. Over a
source that reads by id (``MDSSource``, ``ParquetSource`` over a length column),
``dataset.loader(num_workers=N)`` is a ``DataLoader`` whose main process plans and whose
workers read and collate each planned micro-batch
(``chronica.adapters.torch.streaming_workers``): the same micro-batches, the reading off
the planning process.

A trainer that reads ahead of what it trained (Lightning reads one micro-batch ahead of a
loader without a length) tells the stream what it trained: after ``track_trained()`` the
stream keeps the states after the micro-batches it yielded last (a small ring, keyed by
each item's ``(epoch, step, micro)``), ``trained(batch)`` marks one trained, and
``state_dict()`` is then the state after it, so a resumed run starts with the first
micro-batch not trained. ``chronica.torch.StreamCheckpoint`` (a Lightning callback) does
both.
"""

from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from chronica.adapters.torch.streaming_workers import (
    StreamPlanSampler,
    collate_stream,
    stream_loader,
)
from chronica.core import ScheduleConfig
from chronica.core.packing import Packing
from chronica.core.streaming import StreamOptions
from chronica.runtime.streaming import StreamingEngine, reads_by_id
from chronica.runtime.streaming_exchange import Collectives, LocalGroup
from chronica.runtime.streaming_request import stream_face, stream_request

__all__ = ["StreamingDataset", "TorchCollectives"]

# Where a collated micro-batch stands: its (epoch, step, micro).
_Key = tuple[int, int, int]


class TorchCollectives:
    """``Collectives`` over a ``torch.distributed`` process group: ``allgather`` by
    ``all_gather_object``, ``alltoall`` by two ``all_to_all_single`` of bytes (sizes, then
    payloads; gloo and NCCL both have it, NCCL with CUDA tensors: pass a gloo group).

    Args:
        group: the process group (``None``: a new gloo group over the whole world, made
            now, so every rank must construct it at the same point).

    Example::

        collectives = TorchCollectives()  # after init_process_group
    """

    def __init__(self, group: Any = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("TorchCollectives needs torch.distributed.init_process_group first")
        self.group = dist.new_group(backend="gloo") if group is None else group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)

    def allgather(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, payload, group=self.group)
        return out

    def alltoall(self, payloads: list[bytes]) -> list[bytes]:
        """``payloads[r]`` to rank ``r``; what every rank sent this one."""
        sizes = torch.tensor([len(p) for p in payloads], dtype=torch.int64)
        incoming = torch.empty_like(sizes)
        dist.all_to_all_single(incoming, sizes, group=self.group)
        data = torch.frombuffer(bytearray(b"".join(payloads) or b"\0"), dtype=torch.uint8)
        received = torch.empty(max(1, int(incoming.sum())), dtype=torch.uint8)
        dist.all_to_all_single(
            received[: int(incoming.sum())],
            data[: int(sizes.sum())],
            output_split_sizes=incoming.tolist(),
            input_split_sizes=sizes.tolist(),
            group=self.group,
        )
        raw = received.numpy().tobytes()
        bounds = [0, *torch.cumsum(incoming, 0).tolist()]
        return [raw[a:b] for a, b in itertools.pairwise(bounds)]

    def __repr__(self) -> str:
        return f"TorchCollectives(rank={self.rank}, world_size={self.world_size})"


@stream_face
class StreamingDataset(IterableDataset):
    """This rank's packed micro-batches of a sharded stream (see the module docstring):
    balanced across ranks by one global plan per window of ``window_steps`` steps, every
    sample once per pass, resumable bitwise (same world) or exactly-once (another world).

    Args:
        source: a ``ShardedSource`` (``chronica.runtime.sources``) whose records hold token
            sequences (under ``key`` when they are mappings).
        packing: the cap, rows, objective and padding (``chronica.Packing``); ``None`` when
            ``config`` holds it.
        batch_size: samples per global step (without ``packing.tokens_per_step``).
        config: the whole plan request (``chronica.ScheduleConfig``) instead of
            ``packing``, ``batch_size`` and the plan options.
        stream: the stream options whole (``chronica.StreamOptions``) instead of their
            keywords.
        collectives: the ranks' ``Collectives`` (default: ``TorchCollectives()`` when
            ``torch.distributed`` is initialised, else a single rank).
        key: the field of a mapping record holding its tokens.
        pad_to: pad every micro-batch to this many tokens (one static shape), or ``None``.
        options: plan options and stream options by name (listed below).

    Example::

        dataset = StreamingDataset(source, Packing(max_tokens=8192), batch_size=64,
                                   stream=StreamOptions(window_steps=2, buffer_size=512))
        loader = StatefulDataLoader(dataset, batch_size=None)
        for batch in loader:
            loss = model(batch["input_ids"], batch["position_ids"]) * batch["loss_weight"]
    """

    def __init__(
        self,
        source: Any,
        packing: Packing | None = None,
        *,
        batch_size: int | None = None,
        config: ScheduleConfig | None = None,
        stream: StreamOptions | None = None,
        collectives: Collectives | None = None,
        key: str = "input_ids",
        pad_to: int | None = None,
        **options: Any,
    ) -> None:
        if collectives is None:
            initialised = dist.is_available() and dist.is_initialized()
            collectives = TorchCollectives() if initialised else LocalGroup(1).rank(0)
        self.key, self.pad_to = key, pad_to
        config, stream = stream_request(
            options, packing=packing, batch_size=batch_size, collectives=collectives,
            face="StreamingDataset", config=config, stream=stream,
        )  # fmt: skip
        self.engine = StreamingEngine(source, config, collectives, stream)
        self._ring: OrderedDict[_Key, dict[str, Any]] = OrderedDict()
        self._depth = 0  # the states kept (0: track_trained() was not called)
        self._last: _Key | None = None  # the micro-batch yielded last
        self._trained: dict[str, Any] | None = None  # the state after the one trained last
        self._sampler: StreamPlanSampler | None = None  # loader()'s, once it was called

    def __repr__(self) -> str:
        return f"StreamingDataset({self.engine!r})"

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if get_worker_info() is not None:
            raise ValueError(
                "StreamingDataset reads ahead in a thread of its own: use num_workers=0 "
                "(DataLoader(dataset, batch_size=None)), or, over a source that reads by id "
                "(MDSSource, ParquetSource), dataset.loader(num_workers=N): workers that read "
                "and collate"
            )
        if self._sampler is not None:
            raise ValueError(
                "this StreamingDataset plans for dataset.loader()'s workers; iterate the "
                "loader it returned"
            )
        self._forget()
        for batch in self.engine.micro_batches():
            self._last = (batch.epoch, batch.step, batch.micro)
            if self._depth:
                self._keep(self._last)
            yield collate_stream(batch, self.key, self.pad_to)

    def loader(self, num_workers: int = 1, **options: Any) -> DataLoader:
        """A ``DataLoader`` of this stream's micro-batches whose main process plans (the
        engine over the lengths alone) and whose ``num_workers`` worker processes read each
        planned micro-batch by id and collate it: the same micro-batches, byte for byte, as
        ``DataLoader(dataset, batch_size=None)``, with exactly-once, equal counts, caps and
        resume kept; ``state_dict()`` is then the state after the last micro-batch the loop
        received (the workers fetch ahead of it). Needs a source that reads by id
        (``random_access`` and ``lengths_without_records``: ``MDSSource`` or
        ``ParquetSource`` over a length column); ``ValueError`` otherwise, naming why
        (WebDataset tars: their lengths are inside the records) and what to use instead.
        The dataset is from then on iterated through the loader only.

        Args:
            num_workers: worker processes, ``>= 0`` (0: read in this process).
            options: further ``DataLoader`` arguments (``prefetch_factor``,
                ``pin_memory``, ``persistent_workers``, ``multiprocessing_context``, ...).

        Example::

            dataset = StreamingDataset(MDSSource(folder, length="input_ids"),
                                       Packing(max_tokens=8192), batch_size=64)
            for batch in dataset.loader(num_workers=2):
                ...
        """
        source = self.engine.source
        if not reads_by_id(source):
            why = (
                "has no random access: its records reach their planned rank by the "
                "all-to-all, so no worker can read one by id"
                if not source.random_access
                else "cannot read lengths without records (a length function, or a length "
                "kept inside each record, as a tar's fields are): planning here would read "
                "every record in this process"
            )
            raise ValueError(
                f"dataset.loader() plans in this process over the lengths alone and reads "
                f"each planned sample by id in the workers; {source!r} {why}. Iterate "
                "DataLoader(dataset, batch_size=None, num_workers=0) instead (the engine "
                "reads in a thread of its own), or keep the data as MDS (MDSSource) or "
                "parquet (ParquetSource) with length naming a column of lengths or tokens"
            )
        if self.engine.decode:
            self.engine.close()
            engine = self.engine
            self.engine = StreamingEngine(
                source, engine.config, engine.collectives, engine.options,
                state=engine.state_dict(), decode=False,
            )  # fmt: skip
        loader, self._sampler = stream_loader(
            self.engine, self.key, self.pad_to, num_workers, **options
        )
        return loader

    def track_trained(self, depth: int = 8) -> None:
        """From now on keep the states after the ``depth`` micro-batches yielded last (the
        one yielded last included, so calling it after a trainer has read ahead still
        covers that micro-batch), for ``trained``. Costs one ``state_dict()`` per
        micro-batch; calling it again changes only ``depth``.

        Args:
            depth: how many states to keep, ``>= 1`` (a trainer reading ``n`` micro-batches
                ahead needs ``n + 1``).

        Example::

            >>> stream.track_trained()   # chronica.torch.StreamCheckpoint does it
        """
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int, got {type(depth).__name__}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (the states kept), got {depth}")
        if not self._depth and self._last is not None:
            self._keep(self._last)
        self._depth = depth
        while len(self._ring) > depth:
            self._ring.popitem(last=False)

    def trained(self, batch: Mapping[str, Any] | tuple[int, int, int]) -> None:
        """The trainer has trained ``batch`` (an item of this stream, or its
        ``(epoch, step, micro)``): ``state_dict()`` is from now on the state after it, until
        the next ``trained``, ``load_state_dict`` or pass. ``ValueError`` when its state is
        not kept (``track_trained`` was not called, or more than ``depth`` micro-batches
        were read after it): resuming elsewhere would skip or repeat micro-batches.

        Args:
            batch: the micro-batch trained (its ``epoch``, ``step`` and ``micro`` are read).

        Example::

            >>> stream.trained(batch)   # after the optimizer step of a read-ahead trainer
        """
        place = (
            (batch["epoch"], batch["step"], batch["micro"]) if isinstance(batch, Mapping) else batch
        )
        epoch, step, micro = (int(x) for x in place)
        key = (epoch, step, micro)
        state = self._ring.get(key)
        if state is None:
            raise ValueError(
                f"the state after micro-batch (epoch, step, micro) = {key} is not kept "
                f"(kept: {list(self._ring)}); call track_trained(depth) before iterating, "
                "with depth above the micro-batches the trainer reads ahead, so that a "
                "checkpoint neither skips nor repeats micro-batches"
            )
        self._trained = state

    def _keep(self, key: _Key) -> None:
        self._ring[key] = self.engine.state_dict()
        self._ring.move_to_end(key)
        while len(self._ring) > max(1, self._depth):
            self._ring.popitem(last=False)

    def _forget(self) -> None:
        self._ring.clear()
        self._last = self._trained = None

    def report(self, seconds: float, step: int | None = None) -> None:
        """With ``kind="dynamic"``: this rank's own compute time of ``step`` (default: the
        step of the last micro-batch taken), forward and backward before the gradient
        all-reduce; later windows give a slower rank less work
        (``StreamingEngine.report``). Without it nothing happens.

        Args:
            seconds: the rank's compute time of the step.
            step: the global step (the items' ``step``), or ``None``.

        Example::

            >>> batches.report(time.perf_counter() - started)
        """
        self.engine.report(seconds, step)

    def close(self) -> None:
        """Stop the planning thread (``StreamingEngine.close``): on every rank at the same
        point, before ``destroy_process_group``, when a pass is left unfinished."""
        self.engine.close()

    def state_dict(self) -> dict[str, Any]:
        """The stream's global state at the last micro-batch yielded (the same on every
        rank), as plain lists and integers; after ``trained(batch)``, the state after
        ``batch`` (with ``kind="dynamic"``, its step-time reports as of then too); through
        ``loader()``, the state after the last micro-batch the training loop received."""
        if self._trained is not None:
            return copy.deepcopy(self._trained)
        if self._sampler is not None:  # the loop's position, behind the workers' fetching
            return self._sampler.state_dict()
        return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (from ``state_dict()`` of a run of any world size) on the
        next ``iter()``.

        Args:
            state: what ``state_dict()`` returned.
        """
        self.engine = self.engine.resumed(state)
        if self._sampler is not None:
            self._sampler.restart(self.engine)
        self._forget()
