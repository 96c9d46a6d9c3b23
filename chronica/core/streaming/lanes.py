"""Reading lanes: which rows of which shards a rank reads, in which order, and its shuffle
buffer; pure state, no I/O (the runtime reads what a lane names).

Epoch ``e`` permutes the shards with the run's seed (``chronica.core.rng``); lane ``r`` of
``W`` reads shards ``perm[r::W]`` in that order, each from its first row, through a bounded
shuffle buffer of ``capacity`` samples: once full, every sample read takes the place of one
drawn at random from the buffer, which leaves; at the end of the lane the buffer drains in
random order. Draws are counter-based (draw ``i`` is element ``i % 1024`` of the uniforms
of block ``i // 1024``'s key, derived from the lane's), so a lane's whole state is a few
integers and the buffered ids: ``LaneState`` is what the stream's state keeps of every
rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from chronica.core.checks import check_int
from chronica.core.rng import derive_key, permutation, uniforms

__all__ = ["LANE_STREAM", "LaneState", "deal_lanes"]

# The random stream of shard dealing and shuffle buffers (``derive_key``'s ``stream``),
# apart from ``chronica.core.rng.Stream``'s.
LANE_STREAM = 101
# Draws computed at once (one key per block).
_BLOCK = 1024


@dataclass(repr=False)
class LaneState:
    """One reading lane: the shard ranges still to read and the shuffle buffer.

    ``segments`` are ``[shard, start, end]`` row ranges still to read, in order (the first
    one's ``start`` is the cursor); ``buffer_ids``/``buffer_lengths`` the buffered samples
    (slot order); ``draws`` the random draws made so far under ``key``. The buffer's
    records themselves are the reader's (``payloads``, kept beside the state, not in it: a
    list, or an object ``ndarray`` once ``offer_block`` was given one; ``None`` where the
    reader keeps no records, reading them by id later: ``offer_block`` and ``drain_block``
    then move ids and lengths only).

    Args:
        key: the lane's random key (``derive_key``), as an ``int``.
        capacity: the shuffle buffer's size in samples, ``>= 1`` (1: no shuffling).
        segments: ``[shard, start, end]`` ranges still to read.
        buffer_ids: buffered sample ids.
        buffer_lengths: their lengths.
        draws: draws made so far.

    Example::

        >>> lane = LaneState(key=1, capacity=2, segments=[[0, 0, 3]])
        >>> [lane.offer(i, 1, None) for i in range(3)][-1][0], lane.remaining
        (0, 2)
    """

    key: int
    capacity: int
    segments: list[list[int]]
    buffer_ids: list[int] = field(default_factory=list)
    buffer_lengths: list[int] = field(default_factory=list)
    draws: int = 0
    payloads: Any = field(default_factory=list, compare=False)
    _block: tuple[int, np.ndarray] = field(
        default=(-1, np.zeros(0)), init=False, compare=False, repr=False
    )

    @property
    def remaining(self) -> int:
        """Samples the lane still holds: unread rows plus buffered samples."""
        return sum(end - start for _, start, end in self.segments) + len(self.buffer_ids)

    @property
    def next_row(self) -> tuple[int, int] | None:
        """``(shard, row)`` the lane reads next, ``None`` once every row was read."""
        return (self.segments[0][0], self.segments[0][1]) if self.segments else None

    def offer(self, sample: int, length: int, payload: Any) -> tuple[int, int, Any] | None:
        """Take the sample just read at ``next_row`` (the cursor moves on); returns the
        ``(id, length, payload)`` it pushes out of a full buffer, else ``None``.

        Args:
            sample: its global id.
            length: its tokens.
            payload: its record (or ``None`` where the reader re-reads by id).
        """
        self._advance(1)
        if len(self.buffer_ids) < self.capacity:
            self._push(sample, length, payload)
            return None
        slot = self._draw(len(self.buffer_ids))
        out = (self.buffer_ids[slot], self.buffer_lengths[slot], self.payloads[slot])
        self.buffer_ids[slot], self.buffer_lengths[slot] = sample, length
        self.payloads[slot] = payload
        return out

    def offer_block(
        self,
        samples: np.ndarray,
        lengths: np.ndarray,
        payloads: Sequence[Any] | np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray, Any]:
        """``offer`` of consecutive samples read from ``next_row`` on, at once (batch
        operations instead of one call per sample; the same draws, the same buffer after):
        the ``(ids, lengths, payloads)`` they push out, in order. Payloads given as an
        object ``ndarray`` are moved as arrays (no Python step per sample): the buffer's
        ``payloads`` become one and the pushed-out payloads are one; a list stays a list.

        Args:
            samples: ``int64`` their global ids, in reading order.
            lengths: ``int64`` their tokens.
            payloads: their records (``None`` each where the reader re-reads by id): a
                list or an object ``ndarray``; or ``None`` for a lane keeping no records
                (its ``payloads`` ``None``), whose pushed-out payloads are then ``None``.

        Example::

            >>> lane = LaneState(key=1, capacity=2, segments=[[0, 0, 3]])
            >>> lane.offer_block(np.arange(3), np.ones(3, np.int64), [None] * 3)[0].tolist()
            [0]
        """
        n = samples.shape[0]
        self._advance(n)
        fill = min(max(self.capacity - len(self.buffer_ids), 0), n)
        self.buffer_ids.extend(samples[:fill].tolist())
        self.buffer_lengths.extend(lengths[:fill].tolist())
        if payloads is not None:
            self.payloads = _joined(self.payloads, payloads[:fill])
        size, count = len(self.buffer_ids), n - fill
        slots = np.minimum((self._uniforms(count) * size).astype(np.int64), size - 1)
        source, after = _replace_slots(slots, size, size + fill)
        every_id = np.concatenate([np.asarray(self.buffer_ids, np.int64), samples])
        every_length = np.concatenate([np.asarray(self.buffer_lengths, np.int64), lengths])
        self.buffer_ids = every_id[after].tolist()
        self.buffer_lengths = every_length[after].tolist()
        if payloads is None:
            return every_id[source], every_length[source], None
        every_payload = _joined(self.payloads, payloads)
        if isinstance(every_payload, np.ndarray):
            self.payloads = every_payload[after]
            return every_id[source], every_length[source], every_payload[source]
        self.payloads = [every_payload[i] for i in after.tolist()]
        return (
            every_id[source],
            every_length[source],
            [every_payload[i] for i in source.tolist()],
        )

    def drain(self) -> tuple[int, int, Any]:
        """Once every row was read: a buffered sample drawn at random, removed."""
        if self.segments or not self.buffer_ids:
            raise ValueError("drain() is for a lane whose rows are all read and buffer not empty")
        slot = self._draw(len(self.buffer_ids))
        out = (self.buffer_ids[slot], self.buffer_lengths[slot], self.payloads[slot])
        for values in (self.buffer_ids, self.buffer_lengths, self.payloads):
            values[slot] = values[-1]
        self.buffer_ids.pop()
        self.buffer_lengths.pop()
        if isinstance(self.payloads, np.ndarray):
            self.payloads = self.payloads[:-1]
        else:
            self.payloads.pop()
        return out

    def drain_block(self, count: int) -> tuple[np.ndarray, np.ndarray, Any]:
        """``drain()`` ``count`` times at once (or until the buffer is empty): the same
        draws and samples, as ``(ids, lengths, payloads)`` arrays (payloads a list when
        the buffer's are, ``None`` when it keeps none).

        Args:
            count: the most samples drained, ``>= 1``.

        Example::

            >>> lane = LaneState(key=1, capacity=2, segments=[[0, 0, 2]])
            >>> _ = lane.offer_block(np.arange(2), np.ones(2, np.int64), [None] * 2)
            >>> sorted(lane.drain_block(5)[0].tolist()), lane.remaining
            ([0, 1], 0)
        """
        if self.segments or not self.buffer_ids:
            raise ValueError("drain() is for a lane whose rows are all read and buffer not empty")
        check_int("count", count, 1)
        left = list(range(len(self.buffer_ids)))
        out = []
        for _ in range(min(count, len(left))):
            slot = self._draw(len(left))
            out.append(left[slot])
            left[slot] = left[-1]
            left.pop()
        ids, lengths = np.asarray(self.buffer_ids), np.asarray(self.buffer_lengths)
        payloads = self.payloads
        self.buffer_ids, self.buffer_lengths = ids[left].tolist(), lengths[left].tolist()
        taken: Any = None
        if isinstance(payloads, np.ndarray):
            self.payloads = payloads[left]
            taken = payloads[out]
        elif payloads is not None:
            self.payloads = [payloads[i] for i in left]
            taken = [payloads[i] for i in out]
        return ids[out].astype(np.int64), lengths[out].astype(np.int64), taken

    def _advance(self, rows: int) -> None:
        """Move the cursor ``rows`` rows on."""
        while rows:
            head = self.segments[0]
            step = min(rows, head[2] - head[1])
            head[1] += step
            rows -= step
            if head[1] >= head[2]:
                self.segments.pop(0)

    def _push(self, sample: int, length: int, payload: Any) -> None:
        self.buffer_ids.append(int(sample))
        self.buffer_lengths.append(int(length))
        if isinstance(self.payloads, np.ndarray):
            self.payloads = _joined(self.payloads, [payload])
        else:
            self.payloads.append(payload)

    def _draw(self, bound: int) -> int:
        block, i = divmod(self.draws, _BLOCK)
        u = float(self._uniform_block(block)[i])
        self.draws += 1
        return min(int(u * bound), bound - 1)

    def _uniforms(self, count: int) -> np.ndarray:
        """The next ``count`` draws' uniforms (the draws are made)."""
        first, end = self.draws, self.draws + count
        blocks = range(first // _BLOCK, -(-end // _BLOCK))
        every = [self._uniform_block(b) for b in blocks]
        self.draws = end
        if not every:
            return np.zeros(0)
        return np.concatenate(every)[first - blocks.start * _BLOCK : end - blocks.start * _BLOCK]

    def _uniform_block(self, block: int) -> np.ndarray:
        """The uniforms of draw block ``block`` (the last one used is kept)."""
        if self._block[0] != block:
            self._block = (block, uniforms(_BLOCK, derive_key(self.key, 0, LANE_STREAM, block)))
        return self._block[1]

    def to_dict(self) -> dict[str, Any]:
        """The lane as plain integers and lists (no payloads)."""
        return {
            "key": int(self.key),
            "capacity": self.capacity,
            "segments": [list(map(int, s)) for s in self.segments],
            "buffer_ids": list(self.buffer_ids),
            "buffer_lengths": list(self.buffer_lengths),
            "draws": self.draws,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LaneState:
        """The lane ``to_dict`` gave; payloads ``None`` (the reader fetches them by id).

        Args:
            state: ``to_dict``'s output.
        """
        ids = list(map(int, state["buffer_ids"]))
        return cls(
            key=int(state["key"]),
            capacity=int(state["capacity"]),
            segments=[list(map(int, s)) for s in state["segments"]],
            buffer_ids=ids,
            buffer_lengths=list(map(int, state["buffer_lengths"])),
            draws=int(state["draws"]),
            payloads=[None] * len(ids),
        )

    def __repr__(self) -> str:
        """The lane's position."""
        return (
            f"LaneState(next_row={self.next_row}, buffered={len(self.buffer_ids)}, "
            f"capacity={self.capacity}, remaining={self.remaining})"
        )


def deal_lanes(
    shard_sizes: Any, world_size: int, seed: int, epoch: int, capacity: int, generation: int = 0
) -> list[LaneState]:
    """Epoch ``epoch``'s lanes for ``world_size`` ranks: the shards permuted by
    ``(seed, epoch)``, lane ``r`` reading ``perm[r::world_size]`` through a buffer of
    ``capacity`` samples.

    Args:
        shard_sizes: records per shard.
        world_size: the lanes (ranks), ``>= 1``.
        seed: the run's seed.
        epoch: the epoch.
        capacity: shuffle buffer size in samples, ``>= 1``.
        generation: tells apart the keys of lanes dealt again after a change of world.

    Example::

        >>> [lane.segments for lane in deal_lanes([2, 3], 2, seed=0, epoch=0, capacity=1)]
        [[[1, 0, 3]], [[0, 0, 2]]]
    """
    w = check_int("world_size", world_size, 1)
    check_int("capacity", capacity, 1, hint=" (shuffle buffer samples)")
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    order = permutation(sizes.shape[0], derive_key(seed, epoch, LANE_STREAM))
    return [
        LaneState(
            key=int(derive_key(seed, epoch, LANE_STREAM, generation + 1, r)),
            capacity=capacity,
            segments=[[int(s), 0, int(sizes[s])] for s in order[r::w] if sizes[s] > 0],
        )
        for r in range(w)
    ]


def _joined(kept: Any, more: Any) -> Any:
    """``kept + more``: a list while both are lists, else an object ``ndarray``."""
    if not isinstance(kept, np.ndarray) and not isinstance(more, np.ndarray):
        return list(kept) + list(more)
    return np.concatenate([_objects(kept), _objects(more)])


def _objects(values: Any) -> np.ndarray:
    """``values`` as a 1-d object ``ndarray`` (records that are sequences stay whole)."""
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    return np.fromiter(values, dtype=object, count=len(values))


@njit(cache=True, nogil=True)
def _replace_slots(slots: np.ndarray, size: int, first: int) -> tuple[np.ndarray, np.ndarray]:
    """A full buffer of ``size`` slots (holding elements ``0 .. size - 1``) takes the
    elements ``first, first + 1, ...`` one after another, each into slot ``slots[j]``,
    pushing out what the slot held: the elements pushed out, in order, and every slot's
    element after."""
    after = np.arange(size)
    source = np.empty(slots.shape[0], np.int64)
    for j in range(slots.shape[0]):
        slot = slots[j]
        source[j] = after[slot]
        after[slot] = first + j
    return source, after
