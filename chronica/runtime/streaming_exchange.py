"""What the streaming engine needs from the ranks and from a source: two collectives, and
records fetched by id.

``Collectives`` is the whole interface the engine asks of a framework: ``allgather`` of one
``bytes`` per rank and ``alltoall`` of one ``bytes`` per pair of ranks (the torch face
implements it over ``torch.distributed``; ``LocalGroup`` over threads of one process, for
single-process use, tests and benchmarks). ``fetch_records`` reads samples by global id,
by ``read_rows`` where the source has random access (``chronica.runtime.sources.read_ids``),
else by reading each shard from the first wanted row (what a resume does for records no
rank holds any more). ``encode`` / ``decode`` are the bytes the collectives carry: msgpack,
numpy arrays and scalars as (dtype, shape, bytes), never pickle: what another rank sends is
data, never code.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import msgpack
import numpy as np

from chronica.core.checks import check_int
from chronica.runtime.sources.base import read_ids

__all__ = ["Collectives", "LocalGroup", "decode", "encode", "fetch_records"]

_ARRAY, _SCALAR = 1, 2  # msgpack extension types


@runtime_checkable
class Collectives(Protocol):
    """The collectives of the ranks sharing a stream. Every rank calls each one in the same
    order (the engine calls them from its planning thread only).

    Example::

        >>> group = LocalGroup(1)
        >>> group.rank(0).allgather(b"x")
        [b'x']
    """

    rank: int
    world_size: int

    def allgather(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order."""
        ...

    def alltoall(self, payloads: list[bytes]) -> list[bytes]:
        """``payloads[r]`` goes to rank ``r``; returns what every rank sent this one."""
        ...


class LocalGroup:
    """``world_size`` ranks as threads of one process, meeting at a barrier: the
    ``Collectives`` of ``rank(r)`` for each (one thread per rank; a single rank needs none).

    Args:
        world_size: the ranks, ``>= 1``.

    Example::

        >>> LocalGroup(2)
        LocalGroup(world_size=2)
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = check_int("world_size", world_size, 1)
        self._barrier = threading.Barrier(self.world_size)
        self._slots: list[Any] = [None] * self.world_size

    def rank(self, rank: int) -> _LocalRank:
        """Rank ``rank``'s collectives.

        Args:
            rank: in ``0 .. world_size - 1``.

        Example: ``LocalGroup(2).rank(1).world_size`` is 2.
        """
        return _LocalRank(self, check_int("rank", rank, 0, self.world_size - 1))

    def _exchange(self, rank: int, value: Any) -> list[Any]:
        self._slots[rank] = value
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()
        return out

    def __repr__(self) -> str:
        return f"LocalGroup(world_size={self.world_size})"


class _LocalRank:
    """One rank of a ``LocalGroup``."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self._group, self.rank, self.world_size = group, rank, group.world_size

    def allgather(self, payload: bytes) -> list[bytes]:
        return self._group._exchange(self.rank, payload)

    def alltoall(self, payloads: list[bytes]) -> list[bytes]:
        rows = self._group._exchange(self.rank, list(payloads))
        return [row[self.rank] for row in rows]

    def __repr__(self) -> str:
        return f"LocalGroup.rank({self.rank}) of {self.world_size}"


def fetch_records(source: Any, offsets: np.ndarray, ids: Sequence[int]) -> dict[int, Any]:
    """The records of samples ``ids`` (global ids), read by ``read_rows`` where the source
    has random access, else shard by shard with ``read`` from the first wanted row.

    Args:
        source: a ``ShardedSource``.
        offsets: its ``shard_offsets``.
        ids: the samples wanted.

    Example: ``fetch_records(source, shard_offsets(source), [4, 0])[4]`` is the record of
    global id 4.
    """
    wanted = np.unique(np.asarray(list(ids), dtype=np.int64))
    if source.random_access:
        keys = wanted.tolist()
        return dict(zip(keys, read_ids(source, offsets, keys), strict=True))
    shard = np.searchsorted(offsets, wanted, side="right") - 1
    out: dict[int, Any] = {}
    for s in np.unique(shard).tolist():
        rows = (wanted[shard == s] - offsets[s]).tolist()
        want, first, last = set(rows), rows[0], rows[-1]
        for row, record in enumerate(source.read(s, first), start=first):
            if row in want:
                out[int(offsets[s] + row)] = record
            if row >= last:
                break
    return out


def _pack_numpy(value: Any) -> msgpack.ExtType:
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        head = msgpack.packb([value.dtype.str, list(value.shape)])
        return msgpack.ExtType(_ARRAY, head + value.tobytes(order="C"))
    if isinstance(value, np.generic):
        return msgpack.ExtType(_SCALAR, msgpack.packb(value.dtype.str) + value.tobytes())
    raise TypeError(
        f"a record holds a {type(value).__name__}, which cannot travel between ranks: "
        "records must be plain data (dicts, lists, str, bytes, numbers, numpy arrays)"
    )


def _unpack_numpy(code: int, data: bytes) -> Any:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    head = unpacker.unpack()
    body = data[unpacker.tell() :]
    if code == _ARRAY:
        dtype, shape = head
        return np.frombuffer(body, dtype=np.dtype(dtype)).reshape(tuple(shape)).copy()
    if code == _SCALAR:
        return np.frombuffer(body, dtype=np.dtype(head))[0]
    return msgpack.ExtType(code, data)


def encode(value: Any) -> bytes:
    """``value`` (plain data: dicts, lists, str, bytes, numbers, numpy arrays and scalars)
    as the bytes a collective carries; ``decode`` gives it back (tuples come back as
    lists, arrays as writable copies of the same dtype, shape and values).

    Args:
        value: what to send.

    Example::

        >>> decode(encode({"ids": np.arange(3), "stop": False}))["ids"].tolist()
        [0, 1, 2]
    """
    return msgpack.packb(value, default=_pack_numpy, use_bin_type=True)


def decode(data: bytes) -> Any:
    """What ``encode`` made of a value (msgpack with numpy extensions; no code runs).

    Args:
        data: the bytes another rank sent.

    Example: ``decode(encode([1, "a"]))`` is ``[1, "a"]``.
    """
    return msgpack.unpackb(data, ext_hook=_unpack_numpy, raw=False, strict_map_key=False)
