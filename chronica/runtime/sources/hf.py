"""Local jsonl or parquet files read through Hugging Face ``datasets`` streaming.

``HFStreamingSource`` makes every file one shard and reads it with
``datasets.load_dataset(builder, data_files=[file], split="train", streaming=True)``: the
examples come out exactly as ``datasets`` streams them (its features, its decoding:
dicts of Python values). ``datasets`` streaming has no seek, so a read from row ``r``
skips ``r`` examples (``IterableDataset.skip``: they are read and dropped) and there is
no random access; for parquet files, ``ParquetSource`` seeks by row group instead. The
shards' sizes are counted once per file, on first use: a parquet file's footer, or a
jsonl file's non-blank lines (one scan).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from chronica.runtime.sources.base import (
    check_length,
    check_length_kept,
    check_names,
    check_shard,
    check_start,
    length_label,
    no_random_access,
    record_length,
    record_lengths,
    shard_paths,
)

__all__ = ["HFStreamingSource"]

# The ``datasets`` builder reading each file ending.
BUILDERS = {".jsonl": "json", ".parquet": "parquet"}


class HFStreamingSource:
    """Local ``.jsonl`` or ``.parquet`` files streamed by HF ``datasets``, one shard per
    file, as a ``ShardedSource`` without random access.

    Guarantees: ``read(s, start)`` yields file ``s``'s examples from row ``start`` in file
    order, as ``datasets`` streams them; ``shard_size`` equals the number of examples
    ``datasets`` yields for the file (a parquet footer's row count, a jsonl file's
    non-blank lines); ``read_rows`` raises ``NotImplementedError`` (the streaming engine
    moves such records between ranks instead). Memory: what ``datasets`` buffers while
    streaming one file (a parquet row group, a block of jsonl lines) per ``read`` in
    progress.

    Args:
        files: the folder holding the files (sorted by name; every ``.jsonl`` and
            ``.parquet`` file in it), or a list of files; one shard per file. All files
            must have the same ending.
        length: a record's size in tokens: the name of a field holding the tokens (a list:
            its ``len``) or the length (an integer), or a function of the record.
        columns: the fields kept in a record (``None``: all), through ``datasets``'
            ``select_columns``.

    Example::

        >>> Path("a.jsonl").write_text('{"tokens": [1, 2]}\\n{"tokens": [3]}\\n')
        >>> source = HFStreamingSource(["a.jsonl"], length="tokens")
        >>> source.shard_size(0), list(source.read(0, start=1))
        (2, [{'tokens': [3]}])
    """

    random_access = False

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        length: str | Callable[[Any], int],
        columns: Sequence[str] | None = None,
    ) -> None:
        self.files = shard_paths(files, tuple(BUILDERS))
        endings = {path.suffix for path in self.files}
        if len(endings) > 1 or not endings <= set(BUILDERS):
            raise ValueError(
                f"files must all be .jsonl or all .parquet; got endings {sorted(endings)}"
            )
        self.builder = BUILDERS[endings.pop()]
        self._length = check_length(length)
        self.columns = check_names("columns", columns)
        if self.columns is not None:
            check_length_kept(self._length, self.columns, "columns")
        self._sizes: dict[int, int] = {}
        self._streams: dict[int, Any] = {}

    @property
    def num_shards(self) -> int:
        """How many files the source reads."""
        return len(self.files)

    def shard_size(self, shard: int) -> int:
        """The number of examples of file ``shard`` (counted once, on first use).

        Args:
            shard: a shard in ``[0, num_shards)``.
        """
        shard = check_shard(shard, self.num_shards)
        if shard not in self._sizes:
            self._sizes[shard] = _count_rows(self.files[shard], self.builder)
        return self._sizes[shard]

    def read(self, shard: int, start: int = 0) -> Iterator[dict[str, Any]]:
        """File ``shard``'s examples in order from row ``start`` (the first ``start`` are
        read and skipped).

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row read, in ``[0, shard_size(shard)]``.
        """
        start = check_start(start, self.shard_size(shard))
        if start == self.shard_size(shard):  # nothing left (datasets fails on an empty file)
            return iter(())
        return islice(self._stream(shard), start, None)

    def _stream(self, shard: int) -> Iterator[dict[str, Any]]:
        # Built once per file (``load_dataset`` resolves the files and the builder, which
        # costs more than reading a small shard); every iteration starts at the file's top.
        if shard not in self._streams:
            from datasets import load_dataset

            stream = load_dataset(
                self.builder, data_files=[str(self.files[shard])], split="train", streaming=True
            )
            if self.columns is not None:
                try:
                    stream = stream.select_columns(self.columns)
                except ValueError as error:
                    raise ValueError(f"columns={self.columns!r}: {error}") from None
            self._streams[shard] = stream
        yield from self._streams[shard]

    def read_rows(self, shard: int, rows: Sequence[int]) -> NoReturn:
        """Not available: ``datasets`` streaming reads a file in order only.

        Args:
            shard: a shard in ``[0, num_shards)``.
            rows: rows of the shard.
        """
        raise no_random_access(self)

    def length(self, record: Any) -> int:
        """The size of ``record`` in tokens (the ``length`` field or function).

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
        length = length_label(self._length)
        folder = str(Path(self.files[0]).parent)
        return (
            f"HFStreamingSource({folder!r}, builder={self.builder!r}, "
            f"num_shards={self.num_shards}, length={length!r}, columns={self.columns!r})"
        )


def _count_rows(path: Path, builder: str) -> int:
    if builder == "parquet":
        import pyarrow.parquet as pq

        return int(pq.read_metadata(path).num_rows)
    with open(path, "rb") as file:
        return sum(1 for line in file if line.strip())
