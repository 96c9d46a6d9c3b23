"""``RecordTable``: the records a streaming rank holds, by global id, as two arrays.

The streaming engine holds a window's records (what its lane read, the carry-over's, those
fetched by index or received from other ranks) and hands them out in planned order. Kept
as an ``int64`` array of ids beside an object array of records, every step of that is an
array operation (joins, selections, lookups by id through one sort), with no Python step
per record; a record is never copied, only referenced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["RecordTable", "objects"]


def objects(values: Iterable[Any], count: int | None = None) -> np.ndarray:
    """``values`` as a 1-d object ``ndarray``, each value one element (a record that is a
    list, tuple or array stays one element, never a row of a 2-d array).

    Args:
        values: the records.
        count: how many there are (``len(values)`` when ``None``).

    Example::

        >>> objects([[1, 2], [3, 4]]).shape
        (2,)
    """
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    n = len(values) if count is None else count  # type: ignore[arg-type]
    return np.fromiter(values, dtype=object, count=n)


class RecordTable:
    """Records by global sample id: ``ids`` (``int64``, distinct) and ``records`` (a 1-d
    object array, ``records[i]`` the record of ``ids[i]``).

    Guarantees: ``take(ids)`` returns the records of ``ids`` in the order asked, or raises
    ``KeyError`` naming an id the table lacks; ``join`` and ``select`` keep records by
    reference. Lookups sort the ids once (the order and the sorted ids cached).

    Args:
        ids: the samples' global ids (integers, distinct).
        records: their records, as many (a sequence or an object array).

    Example::

        >>> table = RecordTable([7, 3], ["a", "b"])
        >>> table.take([3, 7]).tolist(), len(table.select([7]))
        (['b', 'a'], 1)
    """

    def __init__(self, ids: Any, records: Any) -> None:
        self.ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.records = objects(records)
        if self.ids.shape != self.records.shape:
            raise ValueError(
                f"ids and records must be as many, got {self.ids.shape[0]} and "
                f"{self.records.shape[0]}"
            )
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # (order, ids[order])

    @classmethod
    def empty(cls) -> RecordTable:
        """A table of no record."""
        return cls(np.zeros(0, np.int64), np.zeros(0, object))

    @classmethod
    def of(cls, records: Mapping[int, Any]) -> RecordTable:
        """The table of ``{id: record}``.

        Args:
            records: records by global id.
        """
        return cls(np.fromiter(records.keys(), np.int64, len(records)), list(records.values()))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def join(self, other: RecordTable) -> RecordTable:
        """This table's records, then ``other``'s (ids must stay distinct).

        Args:
            other: the records added.
        """
        return RecordTable(
            np.concatenate([self.ids, other.ids]), np.concatenate([self.records, other.records])
        )

    def positions(self, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``ids`` is in the table: ``(found, at)``, ``found`` a bool mask
        and ``at`` the positions of the found ones (into ``ids``/``records``).

        Args:
            ids: global ids.
        """
        wanted = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self._sorted is None:
            order = np.argsort(self.ids, kind="stable")
            self._sorted = order, self.ids[order]
        (order, ordered), n = self._sorted, self.ids.shape[0]
        place = np.minimum(np.searchsorted(ordered, wanted), max(n - 1, 0))
        at = order[place] if n else np.zeros(wanted.shape[0], np.int64)
        found = self.ids[at] == wanted if n else np.zeros(wanted.shape[0], bool)
        return found, at[found]

    def take(self, ids: Any) -> np.ndarray:
        """The records of ``ids``, in that order (an object array).

        Args:
            ids: global ids the table holds.
        """
        found, at = self.positions(ids)
        if not found.all():
            missing = np.asarray(ids, dtype=np.int64).reshape(-1)[~found]
            raise KeyError(f"no record of sample ids {missing[:8].tolist()} is held")
        return self.records[at]

    def select(self, ids: Any) -> RecordTable:
        """The table of those of ``ids`` it holds (in the order of ``ids``).

        Args:
            ids: global ids.
        """
        _, at = self.positions(ids)
        return RecordTable(self.ids[at], self.records[at])

    def __repr__(self) -> str:
        return f"RecordTable(records={len(self)})"
