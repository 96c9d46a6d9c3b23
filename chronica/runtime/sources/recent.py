"""The last values a reader used (open files, decoded row groups), by key: the one cache
the sources share (``MDSSource``'s mapped shards, ``ParquetSource``'s row groups and length
columns)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from chronica.core.checks import check_int

__all__ = ["RecentlyUsed"]

Value = TypeVar("Value")


class RecentlyUsed(Generic[Value]):
    """The last values a reader used (open files, decoded row groups), by key, up to
    ``capacity`` of them, or of their ``weight`` added up (e.g. the rows of decoded row
    groups; the value used last is kept whatever its weight); safe to share between threads
    (a background reader and the training loop). A copy (pickle) starts empty.

    Args:
        capacity: how many values are kept, or their total ``weight`` (the least recently
            used are dropped).
        weight: a value's weight (a picklable function, e.g. ``len``), or ``None``: 1 each.

    Example::

        >>> recent = RecentlyUsed(2)
        >>> recent.get("a", lambda: 1), recent.get("a", lambda: 2), len(recent)
        (1, 1, 1)
        >>> rows = RecentlyUsed(5, weight=len)
        >>> _ = rows.get("a", lambda: [1, 2, 3]), rows.get("b", lambda: [4, 5, 6])
        >>> len(rows)  # 6 rows > 5: "a" was dropped
        1
    """

    def __init__(self, capacity: int, weight: Callable[[Value], int] | None = None) -> None:
        self.capacity = check_int("capacity", capacity, 1)
        if weight is not None and not callable(weight):
            raise TypeError(f"weight={weight!r} must be a function of a value, or None")
        self.weight = weight
        self._items: OrderedDict[Hashable, tuple[Value, int]] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Value]) -> Value:
        """The value kept for ``key``, or ``make()`` (called outside the lock), then kept.

        Args:
            key: what the value is of (e.g. ``(shard, row_group)``).
            make: builds the value when it is not kept.
        """
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        value = make()
        weight = 1 if self.weight is None else int(self.weight(value))
        with self._lock:
            if key in self._items:  # made by another thread meanwhile
                self._total -= self._items.pop(key)[1]
            self._items[key] = (value, weight)
            self._total += weight
            while len(self._items) > 1 and self._total > self.capacity:
                self._total -= self._items.popitem(last=False)[1][1]
        return value

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "weight": self.weight}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["capacity"], state.get("weight"))  # type: ignore[misc]

    def __repr__(self) -> str:
        weight = "" if self.weight is None else f", weight={getattr(self.weight, '__name__', '?')}"
        return f"RecentlyUsed(capacity={self.capacity}{weight}, kept={len(self._items)})"
