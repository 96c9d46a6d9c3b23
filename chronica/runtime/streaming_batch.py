"""What the streaming engine hands out and what it counts: ``StreamMicroBatch`` (one
micro-batch of a rank, its records and where it stands in the stream) and ``StreamStats``
(the planning thread's work, ``CPU_PARTS`` naming its CPU accounts).

``chronica.runtime.streaming`` re-exports all three. An engine that plans only
(``StreamingEngine(..., decode=False)``) hands out micro-batches without records, a few
arrays and numbers to send to the process that reads them by id and gives them back
(``StreamMicroBatch.with_records``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CPU_PARTS", "StreamMicroBatch", "StreamStats"]

# The parts of the planning thread's CPU time (``StreamStats.cpu``).
CPU_PARTS = ("reading", "shuffling", "exchanging", "planning", "assembling")
# A pickled micro-batch's place: epoch, step, micro, num_micro, loss_weight.
_PLACE = struct.Struct("<4qd")


@dataclass(frozen=True, repr=False)
class StreamMicroBatch:
    """One micro-batch of this rank: its samples' ``records`` (row after row), global
    ``ids``, token ``lengths`` and ``rows``, and where it stands: ``epoch``, global
    ``step``, ``micro`` of ``num_micro`` (the same count on every rank), ``loss_weight``
    (``chronica.StepPlan.loss_weights``).

    Args:
        records: the samples' records (empty in a micro-batch sent without them).
        ids: ``int64`` their global ids.
        lengths: ``int64`` their tokens.
        rows: ``int64`` their packed rows.
        epoch: the pass of the stream.
        step: the global step.
        micro: the micro-batch within the step.
        num_micro: micro-batches per rank in the step.
        loss_weight: the micro-batch's loss weight.

    Example: ``batch.micro == batch.num_micro - 1`` marks the step's last micro-batch.
    """

    records: list[Any]
    ids: np.ndarray
    lengths: np.ndarray
    rows: np.ndarray
    epoch: int
    step: int
    micro: int
    num_micro: int
    loss_weight: float

    @classmethod
    def of(cls, **fields: Any) -> StreamMicroBatch:
        """A micro-batch of every field, by name, built without the frozen dataclass's
        ``__init__`` (one ``object.__setattr__`` per field: a third of the engine's
        assembling).

        Args:
            fields: every field of the class, by name.
        """
        batch = object.__new__(cls)
        batch.__dict__.update(fields)
        return batch

    def with_records(self, records: list[Any]) -> StreamMicroBatch:
        """The same micro-batch holding ``records``, one per id.

        Args:
            records: the records of ``ids``, in their order.
        """
        if len(records) != self.ids.shape[0]:
            raise ValueError(
                f"a micro-batch of {self.ids.shape[0]} samples got {len(records)} records; "
                "read one record per id, in the order of ids"
            )
        return StreamMicroBatch.of(**(self.__dict__ | {"records": list(records)}))

    def plan_bytes(self) -> bytes:
        """The micro-batch without its records, as bytes (``from_plan_bytes`` gives it
        back): its place, then its ids, lengths and rows as ``int64``. What a planning
        process sends a ``DataLoader`` worker per micro-batch: multiprocessing's pickler
        sends bytes in a fraction of the time an object takes (it looks the object's
        reconstructor up, by import, for every object it sends).

        Example::

            >>> back = StreamMicroBatch.from_plan_bytes(batch.plan_bytes())
            >>> back.ids.tolist() == batch.ids.tolist()
            True
        """
        place = _PLACE.pack(self.epoch, self.step, self.micro, self.num_micro, self.loss_weight)
        columns = np.concatenate((self.ids, self.lengths, self.rows), dtype=np.int64)
        return place + columns.tobytes()

    @classmethod
    def from_plan_bytes(cls, data: bytes, records: list[Any] | None = None) -> StreamMicroBatch:
        """The micro-batch ``plan_bytes`` gave, holding ``records`` (none: empty); its
        arrays ``int64`` and writable.

        Args:
            data: ``plan_bytes()``'s output.
            records: the records of its ids, in their order, or ``None``.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be the bytes plan_bytes() gave, got {type(data).__name__}")
        epoch, step, micro, num_micro, loss_weight = _PLACE.unpack_from(data)
        columns = np.frombuffer(bytearray(data), np.int64, offset=_PLACE.size)
        ids, lengths, rows = columns.reshape(3, -1)
        return cls.of(
            records=[] if records is None else records, ids=ids, lengths=lengths, rows=rows,
            epoch=epoch, step=step, micro=micro, num_micro=num_micro, loss_weight=loss_weight,
        )  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        # Its place and its columns travel as one buffer (plan_bytes), the records beside.
        return (_unpickled, (self.records, self.plan_bytes()))

    def __repr__(self) -> str:
        return (
            f"StreamMicroBatch(epoch={self.epoch}, step={self.step}, micro={self.micro}/"
            f"{self.num_micro}, samples={self.ids.shape[0]}, tokens={int(self.lengths.sum())})"
        )


def _unpickled(records: list[Any], data: bytes) -> StreamMicroBatch:
    """``StreamMicroBatch.__reduce__``'s inverse."""
    return StreamMicroBatch.from_plan_bytes(data, records)


@dataclass
class StreamStats:
    """What this rank's planning thread did: ``windows``, ``steps``, ``bytes_sent`` (records
    sent to other ranks by the all-to-all), ``rows_fetched`` (records read by index instead;
    over a source read by id, every sample this rank served), seconds the planning thread
    spent ``reading``, ``exchanging`` and ``planning``, and seconds the consumer spent
    ``waiting`` for a planned window (0 when planning keeps ahead of training); and ``cpu``:
    the planning thread's CPU seconds (its own, not the other jobs' of a shared machine) in
    ``"reading"`` (the source's reads, by id too, and the lengths), ``"shuffling"``,
    ``"exchanging"`` (collectives, gathering records), ``"planning"`` and ``"assembling"``.

    Example: ``engine.stats.bytes_sent / engine.stats.steps`` is the bytes per step.
    """

    windows: int = 0
    steps: int = 0
    bytes_sent: int = 0
    rows_fetched: int = 0
    reading: float = 0.0
    exchanging: float = 0.0
    planning: float = 0.0
    waiting: float = 0.0
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CPU_PARTS, 0.0))
