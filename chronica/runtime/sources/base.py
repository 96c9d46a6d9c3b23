"""What a streamed source is: records kept in shards, each shard read in order from any row.

``ShardedSource`` is the protocol every reader of ``chronica.runtime.sources`` follows (MDS,
parquet/jsonl through HF ``datasets``, WebDataset tars) and the one the streaming engine
reads through. A sample's id is global: ``offsets[shard] + row``, with ``offsets`` the
prefix sums of the shards' sizes (``shard_offsets``), so one pass of the stream has ids
``0 .. N-1`` whatever order the shards are read in, an exactly-once check is a set
equality, and a map-style plan over the same order is comparable.

``ListSource`` keeps its shards in memory (lists of records): for tests and examples.
The ``check_*`` helpers are the argument checks every reader shares, so that a bad shard,
row or column is reported the same way by all of them.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from chronica.core.checks import check_int, is_int

# The value types whose ``len`` is a record's length (``column_length``'s fast path).
_SIZED = frozenset({list, tuple, str, bytes, bytearray})

__all__ = [
    "ListSource",
    "ShardedSource",
    "check_length",
    "check_length_kept",
    "check_names",
    "check_rows",
    "check_shard",
    "check_span",
    "check_start",
    "column_length",
    "length_label",
    "locate",
    "no_random_access",
    "read_ids",
    "record_length",
    "record_lengths",
    "shard_offsets",
    "shard_paths",
]


@runtime_checkable
class ShardedSource(Protocol):
    """Records kept in shards, each shard read in order from any row.

    Guarantees every implementation gives:

    - ``num_shards`` and ``shard_size(s)`` do not change for the source's life (read from
      an index or metadata, or one header scan that is cached), so ``shard_offsets`` is
      stable and a sample's global id ``offsets[shard] + row`` names one record for good;
    - ``read(s, start)`` yields the records of shard ``s`` in row order, from row ``start``
      to the shard's end, the same records on every call (deterministic, resumable at any
      ``(shard, row)``); it opens the shard lazily, so an unconsumed iterator costs nothing;
    - ``read_rows(s, rows)`` returns ``[record of row r for r in rows]``, equal to what
      ``read`` yields at those rows, when ``random_access`` is true; otherwise it raises
      ``NotImplementedError`` (the engine then moves records between ranks instead);
    - ``length(record)`` is the record's size in tokens (the cost model's input), an
      ``int >= 0``;
    - records are plain data (dicts, lists, numpy arrays and scalars, bytes, str, numbers),
      so they can be sent between ranks (``chronica.runtime.streaming_exchange.encode``,
      msgpack; nothing is unpickled).

    Example::

        >>> source = ListSource([[b"ab", b"c"], [b"def"]])
        >>> isinstance(source, ShardedSource)
        True
    """

    @property
    def num_shards(self) -> int:
        """How many shards the source has (``>= 1``)."""
        ...

    @property
    def random_access(self) -> bool:
        """Whether ``read_rows`` is cheap (an index or row groups), not an error."""
        ...

    def shard_size(self, shard: int) -> int:
        """The number of records of shard ``shard``.

        Args:
            shard: a shard in ``[0, num_shards)``.
        """
        ...

    def read(self, shard: int, start: int = 0) -> Iterator[Any]:
        """The records of shard ``shard`` in order, from row ``start`` to the shard's end.

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row read, in ``[0, shard_size(shard)]`` (the size: nothing).
        """
        ...

    def read_rows(self, shard: int, rows: Sequence[int]) -> list[Any]:
        """The records of shard ``shard`` at ``rows``, in the order of ``rows``.

        Args:
            shard: a shard in ``[0, num_shards)``.
            rows: rows in ``[0, shard_size(shard))``; repeats allowed.
        """
        ...

    def length(self, record: Any) -> int:
        """The size of ``record`` in tokens.

        Args:
            record: a record this source yielded.
        """
        ...


def shard_offsets(source: ShardedSource) -> np.ndarray:
    """The global id of every shard's first record, and the total: ``int64``, length
    ``num_shards + 1``, ``offsets[0] == 0`` and ``offsets[s + 1] - offsets[s] ==
    source.shard_size(s)``. Record ``row`` of shard ``s`` has id ``offsets[s] + row``.

    Args:
        source: the source whose shards are counted.

    Example::

        >>> shard_offsets(ListSource([[b"a", b"b"], [], [b"c"]])).tolist()
        [0, 2, 2, 3]
    """
    sizes = [source.shard_size(s) for s in range(source.num_shards)]
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def locate(offsets: np.ndarray, sample: int) -> tuple[int, int]:
    """The ``(shard, row)`` of global id ``sample``, given ``shard_offsets``' result.

    Args:
        offsets: the source's ``shard_offsets``.
        sample: a global id in ``[0, offsets[-1])``.

    Example::

        >>> locate(np.array([0, 2, 2, 3]), 2)
        (2, 0)
    """
    total = int(offsets[-1])
    sample = check_int("sample", sample, 0, total - 1, " (a global id: offsets[shard] + row)")
    shard = int(np.searchsorted(offsets, sample, side="right")) - 1
    return shard, sample - int(offsets[shard])


def read_ids(source: ShardedSource, offsets: np.ndarray, ids: Sequence[int]) -> list[Any]:
    """The records of global ids ``ids``, in the order of ``ids``, read by row: one
    ``read_rows`` call per shard the ids fall in (how a rank fetches the samples a plan
    gave it from a source with random access; ``NotImplementedError`` from one without).

    Args:
        source: the source read.
        offsets: the source's ``shard_offsets``.
        ids: global ids in ``[0, offsets[-1])``; repeats allowed.

    Example::

        >>> source = ListSource([[b"a", b"b"], [b"c"]])
        >>> read_ids(source, shard_offsets(source), [2, 0])
        [b'c', b'a']
    """
    groups = _by_shard(offsets, ids)
    if len(groups) == 1:  # the rows of one shard, in the order of ids
        shard, (_, rows) = groups[0]
        return list(source.read_rows(shard, rows))
    records: list[Any] = [None] * len(ids)
    for shard, (at, rows) in groups:
        for i, record in zip(at, source.read_rows(shard, rows), strict=True):
            records[i] = record
    return records


# A shard's ids: (their positions in the ids asked, their rows in the shard).
Group = tuple[list[int], list[int]]
# Up to this many ids (a micro-batch's: a few dozen), Python groups them faster than numpy.
FEW_IDS = 256


def _by_shard(offsets: np.ndarray, ids: Sequence[int]) -> list[tuple[int, Group]]:
    """``ids`` grouped by shard, shards ascending: ``(shard, (positions, rows))``, or
    ``ValueError`` for an id out of range; in Python for up to ``FEW_IDS`` Python ints,
    else with numpy (the same groups)."""
    if not (type(ids) is list and len(ids) <= FEW_IDS and set(map(type, ids)) <= {int}):
        wanted = np.asarray(ids, dtype=np.int64)
        if wanted.size and (wanted.min() < 0 or wanted.max() >= offsets[-1]):
            raise ValueError(f"ids must be global ids in [0, {offsets[-1]}); got {wanted.tolist()}")
        found = np.searchsorted(offsets, wanted, side="right") - 1
        ats = [(s, np.flatnonzero(found == s)) for s in np.unique(found).tolist()]
        return [(s, (at.tolist(), (wanted[at] - offsets[s]).tolist())) for s, at in ats]
    if not ids:
        return []
    bounds = offsets.tolist()
    low, high = min(ids), max(ids)
    if low < 0 or high >= bounds[-1]:
        raise ValueError(f"ids must be global ids in [0, {bounds[-1]}); got {ids}")
    first = bisect.bisect_right(bounds, low) - 1
    if high < bounds[first + 1]:  # every id in one shard
        start = bounds[first]
        return [(first, (list(range(len(ids))), [sample - start for sample in ids]))]
    shards = [bisect.bisect_right(bounds, sample) - 1 for sample in ids]
    # The positions sorted by shard (stable: in order within a shard), cut into runs: C
    # loops, no Python step per id but the rows.
    by_shard = sorted(range(len(ids)), key=shards.__getitem__)
    groups = []
    for shard, run in itertools.groupby(by_shard, key=shards.__getitem__):
        at, start = list(run), bounds[shard]
        groups.append((shard, (at, [ids[i] - start for i in at])))
    return groups


def check_shard(shard: Any, num_shards: int) -> int:
    """``shard`` as an ``int`` if it names a shard; else ``TypeError``/``ValueError``.

    Args:
        shard: the argument given.
        num_shards: the source's ``num_shards``.
    """
    if type(shard) is int and 0 <= shard < num_shards:  # the common call, without messages
        return shard
    return check_int("shard", shard, 0, num_shards - 1, f" (the source has {num_shards} shards)")


def check_start(start: Any, size: int) -> int:
    """``start`` as an ``int`` if it is a row of a shard of ``size`` rows, or ``size``.

    Args:
        start: the argument given.
        size: the shard's size.
    """
    return check_int("start", start, 0, size, f" (the shard has {size} rows)")


def check_span(shard: int, start: int, count: int, size: int) -> None:
    """``ValueError`` naming the rows unless rows ``start .. start + count - 1`` are rows of
    ``shard`` (``size`` rows); an empty span at ``0 .. size`` is.

    Args:
        shard: the shard, for the message.
        start: the first row.
        count: the rows.
        size: the shard's size.
    """
    if not (0 <= start and count >= 0 and start + count <= size):
        raise ValueError(
            f"rows {start} .. {start + count - 1} are not rows of shard {shard} ({size} rows)"
        )


def check_rows(rows: Any, size: int) -> list[int]:
    """``rows`` as a list of ``int`` if every one is a row of a shard of ``size`` rows.

    Args:
        rows: the argument given (a sequence of integers, e.g. a list or a numpy array).
        size: the shard's size.
    """
    if type(rows) is list and set(map(type, rows)) <= {int}:  # a few Python ints
        if not rows or (min(rows) >= 0 and max(rows) < size):
            return list(rows)
    if isinstance(rows, (str, bytes)) or not isinstance(rows, (Sequence, np.ndarray)):
        raise TypeError(f"rows={rows!r} must be a sequence of row numbers (e.g. [0, 5, 2])")
    if type(rows) is list or isinstance(rows, np.ndarray):  # integers in range: as an array
        with contextlib.suppress(ValueError, TypeError):
            values = np.asarray(rows)
            integers = np.issubdtype(values.dtype, np.integer) and values.dtype != np.uint64
            if values.ndim == 1 and integers:
                if not values.size or (int(values.min()) >= 0 and int(values.max()) < size):
                    return values.tolist()
    checked = []
    for row in rows:
        if not is_int(row):
            raise TypeError(f"rows must hold integers; got {row!r}")
        if not 0 <= row < size:
            raise ValueError(f"rows holds {int(row)}; the shard has {size} rows (0..{size - 1})")
        checked.append(int(row))
    return checked


def no_random_access(source: object) -> NotImplementedError:
    """The error ``read_rows`` of a source without random access raises.

    Args:
        source: the source (named in the message).
    """
    return NotImplementedError(
        f"{type(source).__name__} has no random access (random_access is False): read its "
        "shards in order with read(shard, start); the streaming engine moves such records "
        "to their planned rank by an all-to-all instead of reading them by row"
    )


def column_length(record: Any, column: str) -> int:
    """The size of ``record[column]``: the value itself if it is an integer (a column of
    lengths), else its ``len`` (a column of tokens, bytes or text).

    Args:
        record: a mapping of column names to values.
        column: the column holding the length or the tokens.

    Example::

        >>> column_length({"tokens": [5, 6, 7]}, "tokens"), column_length({"n": 4}, "n")
        (3, 4)
    """
    if type(record) is dict:  # the common record: a plain dict of tokens (fast path)
        value: Any = record.get(column)
        if type(value) in _SIZED or (type(value) is np.ndarray and value.ndim):
            return len(value)
    if not isinstance(record, Mapping):
        raise TypeError(f"record must be a mapping of columns to read column {column!r}")
    if column not in record:
        raise ValueError(
            f"length column {column!r} is not in the record (columns: {sorted(record)}); "
            "name one of them as the source's length column"
        )
    value = record[column]
    if is_int(value):
        return int(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return int(value)
    try:
        return len(value)
    except TypeError:
        raise TypeError(
            f"column {column!r} holds {type(value).__name__}, neither an integer length nor "
            "a sized value (tokens, bytes, text)"
        ) from None


def record_length(record: Any, length: Callable[[Any], int] | str) -> int:
    """A record's size by a source's ``length`` argument: a column (``column_length``) or a
    function of the record.

    Args:
        record: the record.
        length: a column name or a function of the record.
    """
    if isinstance(length, str):
        return column_length(record, length)
    return int(length(record))


def record_lengths(records: Sequence[Any], length: Callable[[Any], int] | str) -> np.ndarray:
    """``record_length`` of every record of a block, as ``int64``: the same values (and
    the same errors), with no Python call per record where the records are plain dicts
    whose ``length`` column holds sized values (tokens, bytes, text).

    Args:
        records: the block's records.
        length: a column name or a function of the record.

    Example::

        >>> record_lengths([{"tokens": [5, 6]}, {"tokens": b"abc"}], "tokens").tolist()
        [2, 3]
    """
    n = len(records)
    if isinstance(length, str):
        with contextlib.suppress(KeyError, TypeError):
            if set(map(type, records)) <= {dict}:
                return np.fromiter(map(len, [r[length] for r in records]), np.int64, n)
        return np.fromiter((column_length(r, length) for r in records), np.int64, n)
    return np.fromiter((int(length(r)) for r in records), np.int64, n)


def check_length(length: Any) -> Callable[[Any], int] | str:
    """A source's ``length`` argument if it is a column name or a function; else
    ``TypeError`` naming it.

    Args:
        length: the argument given.
    """
    if not (callable(length) or isinstance(length, str)):
        raise TypeError(f"length={length!r} must be a column name or a function of a record")
    return length


def check_names(argument: str, names: Any) -> list[str] | None:
    """``names`` (the columns or fields a reader keeps) as a list, or ``None`` (all); else
    ``TypeError`` naming ``argument``.

    Args:
        argument: the argument's name in messages (``"columns"``, ``"fields"``).
        names: the argument given.
    """
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(f"{argument}={names!r} must be a list of names, or None")
    return list(names)


def check_length_kept(length: Callable[[Any], int] | str, kept: Sequence[str], where: str) -> None:
    """``ValueError`` when ``length`` names a column that a record will not hold.

    Args:
        length: a source's ``length`` argument.
        kept: the columns (fields) a record holds.
        where: how the message names ``kept`` (e.g. ``"columns"``).
    """
    if isinstance(length, str) and length not in kept:
        raise ValueError(
            f"length={length!r} is not in {where} {list(kept)}; name the column holding the "
            "tokens or the length, or pass a function of the record"
        )


def length_label(length: Callable[[Any], int] | str) -> str:
    """How a ``__repr__`` shows a source's ``length``: the column, or ``<function>``.

    Args:
        length: a source's ``length`` argument.
    """
    return length if isinstance(length, str) else "<function>"


def shard_paths(files: Any, suffixes: tuple[str, ...], argument: str = "files") -> list[Path]:
    """The shard files a source reads, in order: ``files`` itself if it is a sequence of
    paths, or the files of folder ``files`` whose names end with one of ``suffixes``,
    sorted by name. ``TypeError``/``FileNotFoundError``/``ValueError`` name ``argument``.

    Args:
        files: a folder, or a sequence of file paths (one shard each).
        suffixes: the file endings a folder's shards have (e.g. ``(".parquet",)``).
        argument: the argument's name in messages.

    Example::

        >>> shard_paths(["b.tar", "a.tar"], (".tar",))
        [PosixPath('b.tar'), PosixPath('a.tar')]
    """
    if isinstance(files, (str, os.PathLike)):
        folder = Path(files)
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{argument}={str(files)!r} is not a folder; pass the folder holding the "
                f"shards ({', '.join(suffixes)}) or a list of shard files"
            )
        paths = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(suffixes))
        if not paths:
            raise ValueError(
                f"{argument}={str(files)!r} holds no file ending with {' or '.join(suffixes)}"
            )
        return paths
    if not isinstance(files, Sequence) or isinstance(files, bytes):
        raise TypeError(f"{argument} must be a folder or a list of shard files; got {files!r}")
    if not files:
        raise ValueError(f"{argument} is empty; give at least one shard file")
    paths = []
    for file in files:
        if not isinstance(file, (str, os.PathLike)):
            raise TypeError(f"{argument} must hold paths; got {file!r}")
        if not Path(file).is_file():
            raise FileNotFoundError(f"{argument} names {str(file)!r}, which is not a file")
        paths.append(Path(file))
    return paths


class ListSource:
    """A source kept in memory: shard ``s`` is the list ``shards[s]`` of records. For
    tests and examples; it has random access.

    Args:
        shards: one sequence of records per shard (at least one shard; a shard may be
            empty).
        length: the size of a record: a function of the record, or the name of the
            record's column holding its length or its tokens (``column_length``).

    Example::

        >>> source = ListSource([[{"tokens": [1, 2]}], [{"tokens": [3]}]], length="tokens")
        >>> [source.length(r) for r in source.read(0)], source.read_rows(1, [0])
        ([2], [{'tokens': [3]}])
    """

    random_access = True

    def __init__(
        self, shards: Sequence[Sequence[Any]], length: Callable[[Any], int] | str = len
    ) -> None:
        if isinstance(shards, (str, bytes)) or not isinstance(shards, Sequence):
            raise TypeError("shards must be a sequence of shards, each a sequence of records")
        if not shards:
            raise ValueError("shards must hold at least one shard (a list of records)")
        for s, shard in enumerate(shards):
            if isinstance(shard, (str, bytes)) or not isinstance(shard, Sequence):
                raise TypeError(f"shards[{s}] must be a sequence of records")
        self._shards = [list(shard) for shard in shards]
        self._length = check_length(length)

    @property
    def num_shards(self) -> int:
        """How many shards the source has."""
        return len(self._shards)

    def shard_size(self, shard: int) -> int:
        """The number of records of shard ``shard``.

        Args:
            shard: a shard in ``[0, num_shards)``.
        """
        return len(self._shards[check_shard(shard, self.num_shards)])

    def read(self, shard: int, start: int = 0) -> Iterator[Any]:
        """The records of shard ``shard`` in order from row ``start``.

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row read, in ``[0, shard_size(shard)]``.
        """
        records = self._shards[check_shard(shard, self.num_shards)]
        return iter(records[check_start(start, len(records)) :])

    def read_rows(self, shard: int, rows: Sequence[int]) -> list[Any]:
        """The records of shard ``shard`` at ``rows``, in the order of ``rows``.

        Args:
            shard: a shard in ``[0, num_shards)``.
            rows: rows in ``[0, shard_size(shard))``.
        """
        records = self._shards[check_shard(shard, self.num_shards)]
        return [records[r] for r in check_rows(rows, len(records))]

    def length(self, record: Any) -> int:
        """The size of ``record`` (the ``length`` function or column).

        Args:
            record: a record of this source.
        """
        return record_length(record, self._length)

    def block_lengths(self, records: Sequence[Any]) -> np.ndarray:
        """``length`` of every record of a block, as ``int64`` (``record_lengths``).

        Args:
            records: records of this source.
        """
        return record_lengths(records, self._length)

    def __repr__(self) -> str:
        sizes = [len(shard) for shard in self._shards]
        name = (
            self._length
            if isinstance(self._length, str)
            else getattr(self._length, "__name__", "?")
        )
        return f"ListSource(num_shards={len(sizes)}, sizes={sizes}, length={name!r})"
