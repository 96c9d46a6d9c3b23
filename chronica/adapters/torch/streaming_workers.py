"""A stream read by ``DataLoader`` workers: the main process plans, the workers decode.

What torch users do with map-style data (the main process samples, worker processes read
and collate), for a stream over a source that reads by id (``MDSSource`` or
``ParquetSource`` over a length column: ``random_access`` and ``lengths_without_records``):

* the main process runs the streaming engine over the lengths alone
  (``StreamingEngine(..., decode=False)``: the lanes read lengths from the MDS shards'
  headers or the parquet length column, the windows are exchanged and planned as always)
  and ``StreamPlanSampler``, the loader's batch sampler, yields each planned micro-batch
  without records (its ids, lengths, rows, step, micro, loss weight) as bytes
  (``StreamMicroBatch.plan_bytes``: the index queue's pickler sends bytes in a fraction
  of the time an object takes);
* a worker receives it, and ``StreamDecoder.__getitems__`` reads its records by id
  (``read_ids``) and collates them (``collate_stream``, the function the single-process
  path uses), so a micro-batch is the same bytes whatever ``num_workers``.

A ``DataLoader`` asks its batch sampler ``prefetch_factor x num_workers`` micro-batches
ahead of the training loop, so the engine's own position runs ahead of training. The
sampler keeps the engine's ``position()`` after every micro-batch it yielded, from the
first one the loop has not received; ``StreamLoader`` (the ``DataLoader``) counts the
micro-batches it hands the loop, on the sampler, so the count outlives the loader's
iterator (a loop that breaks and drops it), and ``state_dict()`` is the state after the
last micro-batch the loop received: a resumed run starts at the first one it did not,
bitwise.

``collate_stream`` lives here because both paths collate with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset

from chronica.adapters.torch.packed import collate_pieces
from chronica.runtime.sources.base import read_ids, shard_offsets
from chronica.runtime.streaming import StreamingEngine, StreamMicroBatch

__all__ = [
    "StreamDecoder",
    "StreamLoader",
    "StreamPlanSampler",
    "collate_stream",
    "stream_loader",
]

# DataLoader arguments the stream sets itself.
_OWN = ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last")


def collate_stream(batch: StreamMicroBatch, key: str, pad_to: int | None) -> dict[str, Any]:
    """One micro-batch of the stream as ``collate_packed`` builds a packed loader's, plus
    its ``epoch``; an empty micro-batch keeps its place in the step (``num_tokens`` 0,
    ``loss_weight`` 0).

    Args:
        batch: the engine's micro-batch, with its records.
        key: the field of a mapping record holding its tokens.
        pad_to: pad the tokens to this many, or ``None``.

    Example::

        >>> collate_stream(batch, "input_ids", None)["indices"].tolist() == batch.ids.tolist()
        True
    """
    weight = batch.loss_weight if len(batch.ids) else 0.0
    place = (batch.step, batch.micro, batch.num_micro, weight)
    columns = zip(batch.records, batch.ids.tolist(), batch.lengths.tolist(), strict=True)
    pieces = ((record, i, 0, n) for record, i, n in columns)
    out = collate_pieces(pieces, place, key=key, pad_to=pad_to)
    out["epoch"] = batch.epoch
    return out


def _collated(batch: dict[str, Any]) -> dict[str, Any]:
    """The loader's ``collate_fn``: ``StreamDecoder.__getitems__`` collated already."""
    return batch


class StreamDecoder(Dataset):
    """The map-style side of a stream read by workers: ``__getitems__`` takes one planned
    micro-batch (a ``StreamMicroBatch`` without records, or its ``plan_bytes()``, from
    ``StreamPlanSampler``), reads its records from ``source`` by id and returns it
    collated (``collate_stream``).
    Holds the source alone (no engine, thread or process group), so it pickles to workers.

    Args:
        source: the stream's source (reads by id: ``random_access``).
        key: the field of a mapping record holding its tokens.
        pad_to: pad every micro-batch to this many tokens, or ``None``.

    Example::

        >>> decoder = StreamDecoder(source, "input_ids", None)
        >>> decoder.__getitems__(planned.plan_bytes())["step"]
        0
    """

    def __init__(self, source: Any, key: str, pad_to: int | None) -> None:
        self.source, self.key, self.pad_to = source, key, pad_to
        self._offsets: Any = None

    def __repr__(self) -> str:
        return f"StreamDecoder({self.source!r}, key={self.key!r}, pad_to={self.pad_to})"

    def __getitems__(self, plan: StreamMicroBatch | bytes) -> dict[str, Any]:
        if self._offsets is None:
            self._offsets = shard_offsets(self.source)
        batch = (
            plan if isinstance(plan, StreamMicroBatch) else StreamMicroBatch.from_plan_bytes(plan)
        )
        records = read_ids(self.source, self._offsets, batch.ids.tolist())
        return collate_stream(batch.with_records(records), self.key, self.pad_to)

    def __getitem__(self, index: Any) -> Any:
        raise TypeError(
            "StreamDecoder reads whole planned micro-batches (__getitems__), not one index; "
            "build the loader with StreamingDataset.loader()"
        )


class StreamPlanSampler:
    """The batch sampler of a stream read by workers: yields ``engine``'s micro-batches
    (planned without records) as bytes (``StreamMicroBatch.plan_bytes``) and keeps the
    engine's position after each of them until the training loop has received it, so that
    ``state_dict()`` is the state after the last micro-batch the loop received (not the
    last one the loader fetched).

    Args:
        engine: a ``StreamingEngine`` built with ``decode=False``.

    Example::

        loader = DataLoader(StreamDecoder(source, "input_ids", None), num_workers=1,
                            batch_sampler=StreamPlanSampler(engine), collate_fn=...)
    """

    def __init__(self, engine: StreamingEngine) -> None:
        self.engine = engine
        self.received = 0  # micro-batches of this iteration the loop received (StreamLoader)
        self._positions: list[Any] = []  # after micro-batch _first + i of this iteration
        self._first = 0

    def __repr__(self) -> str:
        return f"StreamPlanSampler({self.engine!r})"

    def __iter__(self) -> Iterator[bytes]:
        self._positions, self._first, self.received = [self.engine.position()], 0, 0
        for batch in self.engine.micro_batches():
            self._positions.append(self.engine.position())
            if self.received > self._first:  # the loop is past these: drop their positions
                del self._positions[: self.received - self._first]
                self._first = self.received
            yield batch.plan_bytes()

    def restart(self, engine: StreamingEngine) -> None:
        """Yield ``engine``'s micro-batches from now on (a resumed engine: the positions
        kept of the iteration before are dropped).

        Args:
            engine: a ``StreamingEngine`` built with ``decode=False``.
        """
        self.engine, self._positions, self._first, self.received = engine, [], 0, 0

    def state_dict(self) -> dict[str, Any]:
        """The engine's state after the last micro-batch the loop received (``received``,
        which ``StreamLoader`` counts)."""
        if not self._positions:
            return self.engine.state_dict()
        at = min(self.received - self._first, len(self._positions) - 1)
        return self.engine.state_dict(at=self._positions[at])


class StreamLoader(DataLoader):
    """The ``DataLoader`` of a stream read by workers (``StreamDecoder`` batched by
    ``StreamPlanSampler``): iterating it hands out the loader's micro-batches and counts
    each on the sampler as the loop receives it, so the sampler's ``state_dict()`` is the
    loop's position whatever the workers fetched ahead, and stays so after the loop drops
    its iterator.

    Args:
        args: ``DataLoader``'s arguments.
        kwargs: ``DataLoader``'s keyword arguments (``batch_sampler`` a
            ``StreamPlanSampler``).

    Example::

        loader = StreamLoader(StreamDecoder(source, "input_ids", None), num_workers=1,
                              batch_sampler=StreamPlanSampler(engine), collate_fn=...)
    """

    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        assert isinstance(sampler, StreamPlanSampler)
        for batch in super().__iter__():
            sampler.received += 1
            yield batch


def stream_loader(
    engine: StreamingEngine, key: str, pad_to: int | None, num_workers: int, **options: Any
) -> tuple[StreamLoader, StreamPlanSampler]:
    """A ``StreamLoader`` (a ``DataLoader``) whose batch sampler plans in this process
    (``engine``, built with ``decode=False``) and whose ``num_workers`` workers read and
    collate each micro-batch.

    Args:
        engine: the planning engine.
        key: the field of a mapping record holding its tokens.
        pad_to: pad every micro-batch to this many tokens, or ``None``.
        num_workers: worker processes (0: decode in this process).
        options: further ``DataLoader`` arguments (``prefetch_factor``, ``pin_memory``,
            ``persistent_workers``, ``multiprocessing_context``, ``timeout``, ...).

    Example::

        loader, sampler = stream_loader(engine, "input_ids", None, num_workers=1)
    """
    given = sorted(set(options) & set(_OWN))
    if given:
        raise ValueError(
            f"StreamingDataset.loader() sets {given} itself (one planned micro-batch per "
            "batch, collated by chronica); leave them out"
        )
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(f"num_workers must be an int, got {type(num_workers).__name__}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    sampler = StreamPlanSampler(engine)
    loader = StreamLoader(
        StreamDecoder(engine.source, key, pad_to),
        batch_sampler=sampler,
        collate_fn=_collated,
        num_workers=num_workers,
        **options,
    )
    return loader, sampler
