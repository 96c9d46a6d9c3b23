"""``ReadingLane``: one rank's lane of a sharded source, read through its shuffle buffer.

A lane (``chronica.core.streaming.LaneState``) names the rows a rank reads and holds its
shuffle buffer; ``ReadingLane`` reads them from the source. Rows are read in blocks from
one open reader per shard (``read(shard, row)`` is called again only when the lane moves
to another shard or row), each block's lengths taken once, and the block offered to the
buffer at once: ids and lengths as ``int64`` arrays, records as an object array, so the
reading costs what reading the source alone does plus one list per block. A lane given
``read_lengths`` (a source with random access that reads lengths without building records,
such as ``MDSSource`` and ``ParquetSource`` over a length column) reads no records at all:
its buffer holds ids and lengths, and the engine reads each planned sample by id once,
when it gathers the window.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from chronica.core.streaming import LaneState
from chronica.runtime.streaming_records import objects

__all__ = ["ReadingLane"]

_NONE = np.zeros(0, object)


class ReadingLane:
    """A lane and the open reader of its current shard.

    Args:
        state: the lane (its ``payloads``: the buffered records, or ``None`` each).
        source: the ``ShardedSource`` read.
        offsets: the source's ``shard_offsets``.
        cpu: where the reading thread's CPU seconds are added up, under ``"reading"``
            (the source's reads and the lengths) and ``"shuffling"`` (the buffer); ``None``:
            a dictionary of its own.
        read_lengths: ``read_lengths(shard, row, count)``, the lengths of rows without
            their records (``take`` then returns no records: ``None``); ``None``: records
            are read and their lengths taken.

    Example::

        >>> source = ListSource([[b"ab", b"c", b"def"]])
        >>> lane = ReadingLane(deal_lanes([3], 1, 0, 0, 2)[0], source, shard_offsets(source))
        >>> ids, lengths, records = lane.take((3, 0), lambda rs: np.array([len(r) for r in rs]))
        >>> sorted(ids.tolist()), lane.state.remaining
        ([0, 1, 2], 0)
    """

    def __init__(
        self,
        state: LaneState,
        source: Any,
        offsets: np.ndarray,
        cpu: dict[str, float] | None = None,
        read_lengths: Callable[[int, int, int], np.ndarray] | None = None,
    ) -> None:
        self.state, self._source, self._offsets = state, source, offsets
        self._read_lengths = read_lengths
        if read_lengths is not None:
            state.payloads = None
        self.cpu = {"reading": 0.0, "shuffling": 0.0} if cpu is None else cpu
        self._reader: Iterator[Any] | None = None
        self._at: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"ReadingLane({self.state!r}, at={self._at})"

    def take(
        self, share: tuple[int, int], lengths_of: Callable[[list[Any]], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Samples out of the shuffle buffer until ``share`` (samples, tokens) is met or
        the lane is empty: ``int64`` ids, ``int64`` lengths, records (an object array;
        ``None`` for a lane given ``read_lengths``).
        Rows are read and offered in blocks (the buffer's free room, then the samples
        still wanted; one row at a time for a share of tokens, which is met only once the
        samples pushed out are known).

        Args:
            share: ``(samples, tokens)`` wanted; one of them 0.
            lengths_of: the lengths of a block of records (``int64``).
        """
        count, tokens = share
        ids: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        records: list[np.ndarray] = []
        lane = self.state
        got, taken = 0, 0
        while (got < count or (tokens and taken < tokens)) and lane.remaining:
            if lane.segments:
                shard, row, end = lane.segments[0]
                room = lane.capacity - len(lane.buffer_ids)
                rows = min(end - row, room if room > 0 else max(count - got, 1))
                cpu = time.thread_time()
                if self._read_lengths is None:
                    block = self._read(shard, row, rows)
                    block_lengths, payloads = lengths_of(block), objects(block)
                else:
                    block_lengths, payloads = self._read_lengths(shard, row, rows), None
                read = time.thread_time()
                self.cpu["reading"] += read - cpu
                first = int(self._offsets[shard]) + row
                out = lane.offer_block(
                    np.arange(first, first + rows, dtype=np.int64), block_lengths, payloads
                )
                self.cpu["shuffling"] += time.thread_time() - read
            else:
                cpu = time.thread_time()
                drained = lane.drain_block(max(count - got, 1))
                payloads = None if drained[2] is None else objects(drained[2])
                out = (drained[0], drained[1], payloads)
                self.cpu["shuffling"] += time.thread_time() - cpu
            ids.append(out[0])
            lengths.append(out[1])
            if out[2] is not None:
                records.append(out[2])
            got += out[0].shape[0]
            taken += int(out[1].sum())
        kept = None if self._read_lengths is not None else np.concatenate([_NONE, *records])
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), kept
        return np.concatenate(ids), np.concatenate(lengths), kept

    def _read(self, shard: int, row: int, rows: int) -> list[Any]:
        """``rows`` records of ``shard`` from ``row`` on, from the open reader when it
        stands there."""
        if self._at != (shard, row) or self._reader is None:
            self._reader = iter(self._source.read(shard, row))
        block = list(itertools.islice(self._reader, rows))
        self._at = (shard, row + rows)
        return block
