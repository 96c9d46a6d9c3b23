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

import os
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from chronica.runtime.sources.base import (
    RecentlyUsed,
    check_length,
    check_length_kept,
    check_names,
    check_rows,
    check_shard,
    check_start,
    length_label,
    record_length,
    record_lengths,
    shard_paths,
)

__all__ = ["ParquetSource", "batch_records"]

# Decoded row groups kept for the next reads (random access touches a row group many times).
CACHED_ROW_GROUPS = 8


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
            columns.append([values[a:b] for a, b in pairwise(bounds)])
        else:
            columns.append(array.to_pylist())
    names = batch.schema.names
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


class ParquetSource:
    """Local parquet files, one shard each, as a ``ShardedSource`` with random access by
    row group.

    Guarantees: ``shard_size`` is the file's row count from its footer (read once per file,
    on first use); ``read(s, start)`` yields the rows from ``start`` in file order, reading
    one row group at a time; ``read_rows`` reads each row group its rows fall in once and
    equals ``read`` at those rows. Records are ``{column: value}`` (``batch_records``).
    The last ``CACHED_ROW_GROUPS`` (8) row groups read stay decoded, so ``read_rows`` calls
    that fall in the same row groups read the file once. Memory: those row groups of the
    columns read, plus one per ``read`` in progress.

    Args:
        files: the folder holding the ``.parquet`` files (sorted by name), or a list of
            files; one shard per file.
        length: a record's size in tokens: the name of a column holding the tokens (a list:
            its ``len``) or the length (an integer), or a function of the record.
        columns: the columns read (``None``: all).

    Example::

        >>> import pyarrow as pa, pyarrow.parquet as pq
        >>> pq.write_table(pa.table({"tokens": [[1, 2], [3]]}), "a.parquet", row_group_size=1)
        >>> source = ParquetSource(["a.parquet"], length="tokens")
        >>> source.shard_size(0), [source.length(r) for r in source.read(0, start=1)]
        (2, [1])
    """

    random_access = True

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        length: str | Callable[[Any], int],
        columns: Sequence[str] | None = None,
    ) -> None:
        import pyarrow.parquet as pq

        self.files = shard_paths(files, (".parquet",))
        self._length = check_length(length)
        self.columns = check_names("columns", columns)
        names = pq.read_schema(self.files[0]).names
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
        self._starts: dict[int, np.ndarray] = {}
        self._cache: RecentlyUsed[list[dict[str, Any]]] = RecentlyUsed(CACHED_ROW_GROUPS)

    @property
    def num_shards(self) -> int:
        """How many parquet files the source reads."""
        return len(self.files)

    def _row_group_starts(self, shard: int) -> np.ndarray:
        """The first row of every row group of the shard, and its row count last."""
        if shard not in self._starts:
            import pyarrow.parquet as pq

            meta = pq.read_metadata(self.files[shard])
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            self._starts[shard] = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        return self._starts[shard]

    def shard_size(self, shard: int) -> int:
        """The number of rows of file ``shard`` (from its footer).

        Args:
            shard: a shard in ``[0, num_shards)``.
        """
        return int(self._row_group_starts(check_shard(shard, self.num_shards))[-1])

    def read(self, shard: int, start: int = 0) -> Iterator[dict[str, Any]]:
        """The rows of file ``shard`` in order from row ``start``.

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row read, in ``[0, shard_size(shard)]``.
        """
        start = check_start(start, self.shard_size(shard))
        starts = self._row_group_starts(shard)
        first = int(np.searchsorted(starts, start, side="right")) - 1
        return self._rows_from(shard, first, start - int(starts[first]))

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
        groups = np.searchsorted(starts, rows, side="right") - 1
        read = {int(g): self._group(shard, int(g)) for g in np.unique(groups)}
        return [read[int(g)][r - int(starts[g])] for r, g in zip(rows, groups, strict=True)]

    def length(self, record: Any) -> int:
        """The size of ``record`` in tokens (the ``length`` column or function).

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
        first = str(Path(self.files[0]).parent)
        return (
            f"ParquetSource({first!r}, num_shards={self.num_shards}, "
            f"length={length_label(self._length)!r}, "
            f"columns={self.columns!r})"
        )
