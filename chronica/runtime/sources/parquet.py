"""Local parquet files as shards, read by row group through pyarrow (random access).

``ParquetSource`` makes every parquet file one shard. A file's row count and row groups
come from its footer (``pyarrow.parquet``), so sizes are known without reading data; a
shard is read row group by row group, a read from row ``r`` starts at the row group that
holds ``r``, and ``read_rows`` reads only the row groups its rows fall in: random access
at the granularity of a row group (a file written with one row group reads it whole).
This is the reading HF ``datasets`` does underneath its streaming parquet builder, without
its per-example conversion; ``HFStreamingSource`` (``chronica.runtime.sources.hf``) reads
through ``datasets`` itself.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chronica.core.checks import check_int
from chronica.runtime.sources.base import (
    check_length,
    check_length_kept,
    check_names,
    check_rows,
    check_shard,
    check_span,
    check_start,
    length_label,
    record_length,
    record_lengths,
    shard_paths,
)
from chronica.runtime.sources.recent import RecentlyUsed

__all__ = ["ParquetSource", "batch_records", "column_lengths", "counted_without_records"]

# Rows of decoded row groups kept for the next reads (``ParquetSource``'s cached_rows): a
# rank reading by id decodes each row group about once while the cache holds the row groups
# its window still draws from, about W x (buffer_size x ln(buffer_size) + 2 x rows per row
# group) rows (the shuffle buffer's stragglers keep a lane's old row groups in use): with
# the default buffer of 1,024 and row groups of 1,000 rows, W <= 4 (1.14 decodes at W = 4).
CACHED_ROWS = 32768
# Row groups' length columns kept for ``read_lengths`` (int64 arrays, 8 bytes a row): a
# lane reads consecutive blocks, so the row group it stands in and the next are what it
# asks again; more for ranks that share one source (threads of one process).
CACHED_LENGTH_GROUPS = 8


def batch_records(batch: Any) -> list[dict[str, Any]]:
    """The rows of a ``pyarrow.RecordBatch`` as ``{column: value}`` records: a list column
    (e.g. tokens) as a numpy array (a view of the batch's values), any other column as the
    Python value ``to_pylist`` gives.

    Args:
        batch: a ``pyarrow.RecordBatch`` (or a table of one chunk per column).

    Example::

        >>> import pyarrow as pa
        >>> batch_records(pa.record_batch({"tokens": [[1, 2], [3]], "id": ["a", "b"]}))
        [{'tokens': array([1, 2]), 'id': 'a'}, {'tokens': array([3]), 'id': 'b'}]
    """
    import pyarrow as pa

    columns = []
    for array in batch.columns:
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            if array.offset:  # a slice: copy it to a batch of its own offsets
                array = pa.concat_arrays([array])
            bounds = array.offsets.to_numpy()
            values = array.values.to_numpy(zero_copy_only=False)
            columns.append([values[a:b] for a, b in itertools.pairwise(bounds)])
        else:
            columns.append(array.to_pylist())
    names = batch.schema.names
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def counted_without_records(kind: Any) -> bool:
    """Whether ``column_lengths`` reads a column of arrow type ``kind``: an integer (the
    lengths), a list, large list or fixed-size list (the tokens), or a binary or large
    binary value (the bytes). Text is left to the records (its ``len`` counts characters).

    Args:
        kind: a ``pyarrow.DataType``.
    """
    import pyarrow as pa

    checks = (
        pa.types.is_integer,
        pa.types.is_list,
        pa.types.is_large_list,
        pa.types.is_fixed_size_list,
        pa.types.is_binary,
        pa.types.is_large_binary,
    )
    return any(check(kind) for check in checks)


def column_lengths(column: Any) -> np.ndarray | None:
    """The lengths ``column_length`` gives the records of a length column, as ``int64``,
    from the arrow arrays alone (no record is built): an integer column's values, a list
    column's offsets' differences (a null list is empty, as in ``batch_records``), a
    fixed-size list's or binary value's length. ``None`` where only the records can say:
    a type ``counted_without_records`` rejects, or a null in a column other than a list
    (the records' own error is then raised by the record path).

    Args:
        column: a ``pyarrow.ChunkedArray`` or ``Array`` (e.g. one column of a row group).

    Example::

        >>> import pyarrow as pa
        >>> column_lengths(pa.chunked_array([[[1, 2], [], None], [[3]]])).tolist()
        [2, 0, 0, 1]
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if not counted_without_records(kind):
        return None
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        parts = [np.diff(c.offsets.to_numpy()) for c in chunks]
    elif column.null_count:
        return None
    elif pa.types.is_integer(kind):
        parts = [c.to_numpy() for c in chunks]
    elif pa.types.is_fixed_size_list(kind):
        parts = [pc.list_value_length(c).to_numpy() for c in chunks]
    else:
        parts = [pc.binary_length(c).to_numpy() for c in chunks]
    return np.concatenate([np.zeros(0, np.int64), *parts]).astype(np.int64, copy=False)


class ParquetSource:
    """Local parquet files, one shard each, as a ``ShardedSource`` with random access by
    row group.

    Guarantees: ``shard_size`` is the file's row count from its footer (read once per file,
    on first use); ``read(s, start)`` yields the rows from ``start`` in file order, reading
    one row group at a time; ``read_rows`` reads each row group its rows fall in once and
    equals ``read`` at those rows. Records are ``{column: value}`` (``batch_records``).
    Decoded row groups stay cached, the last used up to ``cached_rows`` rows, so
    ``read_rows`` calls that fall in the same row groups read the file once. With
    ``length`` a column (``lengths_without_records``), ``read_lengths`` reads that column
    alone, so a streaming engine that plans without decoding (``decode=False``, as
    ``StreamingDataset.loader``'s) plans over the lengths and ``DataLoader`` workers read
    each planned sample by id; a sample read so decodes its whole row group, once per
    process while the cache holds the row groups the window draws from (about
    ``W x (buffer_size x ln(buffer_size) + 2 x rows per row group)`` rows; fewer, and row
    groups are decoded again and again). An engine that decodes in its own process reads
    through its lanes instead (``reads_rows_alone`` is false), which decode each row group
    once, in order. Memory: ``cached_rows`` rows of the columns read, plus one row group
    per ``read`` in progress, plus the lengths of ``CACHED_LENGTH_GROUPS`` (8) row groups
    (8 bytes a row).

    Args:
        files: the folder holding the ``.parquet`` files (sorted by name), or a list of
            files; one shard per file.
        length: a record's size in tokens: the name of a column holding the tokens (a list:
            its ``len``) or the length (an integer), or a function of the record.
        columns: the columns read (``None``: all).
        cached_rows: rows of decoded row groups kept for the next reads (``>= 1``; the row
            group used last is kept whatever its rows).

    Example::

        >>> import pyarrow as pa, pyarrow.parquet as pq
        >>> pq.write_table(pa.table({"tokens": [[1, 2], [3]]}), "a.parquet", row_group_size=1)
        >>> source = ParquetSource(["a.parquet"], length="tokens")
        >>> source.shard_size(0), [source.length(r) for r in source.read(0, start=1)]
        (2, [1])
    """

    random_access = True
    # read_rows decodes the whole row groups of the rows asked: a streaming engine that
    # decodes in its own process reads this source through its lanes, not by id.
    reads_rows_alone = False

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        length: str | Callable[[Any], int],
        columns: Sequence[str] | None = None,
        cached_rows: int = CACHED_ROWS,
    ) -> None:
        import pyarrow.parquet as pq

        self.files = shard_paths(files, (".parquet",))
        self._length = check_length(length)
        self.columns = check_names("columns", columns)
        schema = pq.read_schema(self.files[0])
        names = schema.names
        wanted = names if self.columns is None else self.columns
        missing = [c for c in wanted if c not in names]
        if missing:
            raise ValueError(
                f"columns={self.columns!r} names {missing}, not columns of {self.files[0]} "
                f"(its columns: {names})"
            )
        check_length_kept(
            self._length, wanted, "columns" if self.columns is not None else "its columns"
        )
        self._by_column = isinstance(self._length, str) and counted_without_records(
            schema.field(self._length).type
        )
        self._starts: dict[int, list[int]] = {}
        self._cache: RecentlyUsed[list[dict[str, Any]]] = RecentlyUsed(
            check_int("cached_rows", cached_rows, 1), weight=len
        )
        self._lengths: RecentlyUsed[np.ndarray | None] = RecentlyUsed(CACHED_LENGTH_GROUPS)

    @property
    def num_shards(self) -> int:
        """How many parquet files the source reads."""
        return len(self.files)

    def _row_group_starts(self, shard: int) -> list[int]:
        """The first row of every row group of the shard, and its row count last (Python
        ints: a read by id looks its rows up with ``bisect``, no numpy scalar per row)."""
        if shard not in self._starts:
            import pyarrow.parquet as pq

            meta = pq.read_metadata(self.files[shard])
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            self._starts[shard] = [0, *itertools.accumulate(sizes)]
        return self._starts[shard]

    def shard_size(self, shard: int) -> int:
        """The number of rows of file ``shard`` (from its footer).

        Args:
            shard: a shard in ``[0, num_shards)``.
        """
        return self._row_group_starts(check_shard(shard, self.num_shards))[-1]

    def read(self, shard: int, start: int = 0) -> Iterator[dict[str, Any]]:
        """The rows of file ``shard`` in order from row ``start``.

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row read, in ``[0, shard_size(shard)]``.
        """
        start = check_start(start, self.shard_size(shard))
        starts = self._row_group_starts(shard)
        first = bisect.bisect_right(starts, start) - 1
        return self._rows_from(shard, first, start - starts[first])

    def _rows_from(self, shard: int, group: int, skip: int) -> Iterator[dict[str, Any]]:
        for g in range(group, len(self._row_group_starts(shard)) - 1):
            yield from self._group(shard, g)[skip:]
            skip = 0

    def _group(self, shard: int, group: int) -> list[dict[str, Any]]:
        return self._cache.get((shard, group), lambda: self._decode(shard, group))

    def _decode(self, shard: int, group: int) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        with pq.ParquetFile(self.files[shard]) as file:
            table = file.read_row_group(group, columns=self.columns)
        return [r for batch in table.to_batches() for r in batch_records(batch)]

    def read_rows(self, shard: int, rows: Sequence[int]) -> list[dict[str, Any]]:
        """The rows of file ``shard`` at ``rows``, in the order of ``rows``; each row group
        touched is read once.

        Args:
            shard: a shard in ``[0, num_shards)``.
            rows: rows in ``[0, shard_size(shard))``.
        """
        rows = check_rows(rows, self.shard_size(shard))
        starts = self._row_group_starts(shard)
        if not rows:
            return []
        first = bisect.bisect_right(starts, min(rows)) - 1
        if max(rows) < starts[first + 1]:  # the rows of one row group: the common read
            group, at = self._group(shard, first), starts[first]
            return [group[r - at] for r in rows]
        groups = [bisect.bisect_right(starts, r) - 1 for r in rows]
        read = {g: self._group(shard, g) for g in sorted(set(groups))}
        return [read[g][r - starts[g]] for r, g in zip(rows, groups, strict=True)]

    def length(self, record: Any) -> int:
        """The size of ``record`` in tokens (the ``length`` column or function).

        Args:
            record: a record of this source.
        """
        return record_length(record, self._length)

    @property
    def lengths_without_records(self) -> bool:
        """Whether ``read_lengths`` reads the lengths from the ``length`` column alone,
        without decoding records: ``length`` names a column of a type
        ``counted_without_records`` accepts (an integer, a list or a binary column) in the
        first file. A later file of another type, or a null in a column other than a
        list, is read through its records (the same values)."""
        return self._by_column

    def read_lengths(self, shard: int, start: int, count: int) -> np.ndarray:
        """``length`` of the records of rows ``start .. start + count - 1`` of ``shard``, as
        ``int64``: from the ``length`` column of the row groups those rows fall in, read
        alone and kept for the next call (``column_lengths``), where
        ``lengths_without_records`` holds; else from the decoded records; the same values
        either way.

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row.
            count: the rows, ``start + count <= shard_size(shard)``.
        """
        check_span(shard, start, count, self.shard_size(shard))
        if count and self._by_column:
            starts = self._row_group_starts(shard)
            first = bisect.bisect_right(starts, start) - 1
            last = bisect.bisect_right(starts, start + count - 1) - 1
            kept = [(starts[g], self._group_lengths(shard, g)) for g in range(first, last + 1)]
            parts = [v[max(0, start - s) : start + count - s] for s, v in kept if v is not None]
            if len(parts) == len(kept):  # the rows' part of every row group
                return np.concatenate(parts)
        rows = itertools.islice(self.read(shard, start), count)
        return record_lengths(list(rows), self._length)

    def _group_lengths(self, shard: int, group: int) -> np.ndarray | None:
        def read() -> np.ndarray | None:
            import pyarrow.parquet as pq

            assert isinstance(self._length, str)
            with pq.ParquetFile(self.files[shard]) as file:
                column = file.read_row_group(group, columns=[self._length]).column(0)
            return column_lengths(column)

        return self._lengths.get((shard, group), read)

    def block_lengths(self, records: Sequence[Any]) -> np.ndarray:
        """``length`` of every record of a block, as ``int64`` (``record_lengths``).

        Args:
            records: records of this source.
        """
        return record_lengths(records, self._length)

    def __repr__(self) -> str:
        first = str(Path(self.files[0]).parent)
        return (
            f"ParquetSource({first!r}, num_shards={self.num_shards}, "
            f"length={length_label(self._length)!r}, "
            f"columns={self.columns!r}, cached_rows={self._cache.capacity})"
        )
