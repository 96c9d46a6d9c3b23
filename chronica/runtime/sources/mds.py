"""Mosaic Streaming MDS shards in a local folder, read by row without the package.

``MDSSource`` reads the ``index.json`` and the uncompressed ``.mds`` shard files that
``mosaicml-streaming``'s ``MDSWriter`` writes (format: ``mds_format``). It does not import
``streaming``: version 0.13 imports ``torchvision`` at import time (whose index wheels do
not load beside the CPU torch wheel) and pins ``transformers<5``, and its own split of the
samples over ranks is not exactly-once; chronica's engine deals shards to ranks itself.
A record's ``ndarray`` columns are read-only views of the memory-mapped shard file (no
copy per sample: the page cache holds the bytes, and a held record costs no heap memory);
every other column is a copy. ``write_mds`` writes the same layout (for tests,
documentation and benchmarks where the package is not installed).
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
)
from chronica.runtime.sources.mds_format import (
    ColumnCodec,
    SampleDecoder,
    codec,
    encode_sample,
    length_column,
    shard_header,
)
from chronica.runtime.sources.recent import RecentlyUsed

__all__ = ["MDSSource", "write_mds"]

INDEX = "index.json"
# Shard files kept mapped at once (each holds a file descriptor); older ones are dropped.
OPEN_SHARDS = 16


class _Shard:
    """One mapped shard file: its bytes and its samples' offsets."""

    def __init__(self, path: Path, expected_bytes: int | None, samples: int) -> None:
        size = path.stat().st_size
        if expected_bytes is not None and size != expected_bytes:
            raise ValueError(
                f"MDS shard {path} has {size} bytes but index.json says {expected_bytes}: the "
                "file is truncated or from another write; copy or write the dataset again"
            )
        with open(path, "rb") as file:
            self.data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        count = int(np.frombuffer(self.data, np.uint32, count=1)[0]) if size else 0
        if count != samples:
            raise ValueError(f"MDS shard {path} holds {count} samples, index.json says {samples}")
        self.offsets = np.frombuffer(self.data, np.uint32, count=count + 1, offset=4).copy()
        self._starts = self.offsets.data  # a memoryview: indexed to Python ints, not numpy scalars
        self.view = memoryview(self.data)
        self.bytes = np.frombuffer(self.data, np.uint8) if size else np.zeros(0, np.uint8)

    def sample(self, row: int) -> memoryview:
        """The sample's bytes, a view of the mapped file (no copy): its ``ndarray`` columns
        decode to read-only views of the file's pages, which live as long as any of them."""
        return self.view[self._starts[row] : self._starts[row + 1]]


class MDSSource:
    """The MDS dataset in ``directory`` (the folder holding ``index.json``), read shard by
    shard and by row, as a ``ShardedSource``.

    Guarantees: ``num_shards`` and ``shard_size`` come from ``index.json`` (nothing else is
    read up front); a record is ``{column: value}`` for the columns read (``ndarray``
    columns as read-only numpy arrays, ``int`` as ``int``, scalars as numpy scalars, ``str``,
    ``bytes``, ``json`` values); ``read`` and ``read_rows`` give equal records for equal rows
    (random access through each shard's offset table). Memory: at most ``OPEN_SHARDS`` shard
    files mapped (the page cache holds what was read) plus each mapped shard's offsets
    (4 bytes a sample). Compressed shards are not read: write them with
    ``compression=None``.

    Args:
        directory: the folder holding ``index.json`` and the shard files (``MDSWriter``'s
            ``out``; a split's subfolder if the dataset has splits).
        length: a record's size in tokens: the name of a column holding either the tokens
            (its ``len``) or the length (an integer), or a function of the record.
        columns: the columns decoded into a record (``None``: every column); leave out
            columns not needed (image and ``pkl`` columns must be left out).

    Example::

        >>> records = [{"tokens": np.arange(3, dtype=np.int32)}]
        >>> write_mds("data", [records], {"tokens": "ndarray:int32"})
        >>> source = MDSSource("data", length="tokens")
        >>> source.num_shards, source.shard_size(0), source.length(source.read_rows(0, [0])[0])
        (1, 1, 3)
    """

    random_access = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        length: str | Callable[[Any], int],
        columns: Sequence[str] | None = None,
    ) -> None:
        self.directory = _dataset_folder(directory)
        index = _read_index(self.directory)
        self._shards_info: list[dict[str, Any]] = index["shards"]
        self._length = check_length(length)
        self.columns = check_names("columns", columns)
        self._derive()
        self._open: RecentlyUsed[_Shard] = RecentlyUsed(OPEN_SHARDS)

    def _derive(self) -> None:
        """What the index gives each shard: codecs, decoder and length column."""
        self._layouts = [self._layout(i, info) for i, info in enumerate(self._shards_info)]
        self._decoders = [SampleDecoder(*layout) for layout in self._layouts]
        self._length_columns = [length_column(c, n, self._length) for c, n, _ in self._layouts]

    def _layout(
        self, shard: int, info: Mapping[str, Any]
    ) -> tuple[list[ColumnCodec], list[str], frozenset[str]]:
        """The codecs, names and decoded columns of one shard; checks what the user named."""
        if info.get("format") != "mds":
            raise ValueError(
                f"shard {shard} of {self.directory / INDEX} has format {info.get('format')!r}; "
                "MDSSource reads MDS shards (MDSWriter), not CSV/JSON ones"
            )
        names = list(info["column_names"])
        wanted = names if self.columns is None else self.columns
        missing = [c for c in wanted if c not in names]
        if missing:
            raise ValueError(
                f"columns={self.columns!r} names {missing}, not columns of the dataset "
                f"{self.directory} (its columns: {names})"
            )
        check_length_kept(
            self._length, wanted, "columns" if self.columns is not None else "its columns"
        )
        codecs = []
        for name, encoding, size in zip(
            names, info["column_encodings"], info["column_sizes"], strict=True
        ):
            if name not in wanted:  # skipped by size alone, never decoded
                codecs.append(ColumnCodec(encoding, size, bytes, bytes))
                continue
            try:
                codecs.append(codec(encoding))
            except ValueError as error:
                raise ValueError(f"column {name!r}: {error}") from None
        return codecs, names, frozenset(wanted)

    @property
    def num_shards(self) -> int:
        """How many shards ``index.json`` lists."""
        return len(self._shards_info)

    def shard_size(self, shard: int) -> int:
        """The number of samples of shard ``shard`` (from ``index.json``).

        Args:
            shard: a shard in ``[0, num_shards)``.
        """
        return int(self._shards_info[check_shard(shard, self.num_shards)]["samples"])

    def read(self, shard: int, start: int = 0) -> Iterator[dict[str, Any]]:
        """The records of shard ``shard`` in order from row ``start`` (opened on first use).

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row read, in ``[0, shard_size(shard)]``.
        """
        start = check_start(start, self.shard_size(shard))
        return self._records(shard, range(start, self.shard_size(shard)))

    def read_rows(self, shard: int, rows: Sequence[int]) -> list[dict[str, Any]]:
        """The records of shard ``shard`` at ``rows``, in the order of ``rows``.

        Args:
            shard: a shard in ``[0, num_shards)``.
            rows: rows in ``[0, shard_size(shard))``.
        """
        checked = check_rows(rows, self.shard_size(shard))
        if not checked:
            return []
        opened = self._shard(shard)
        decode = self._decoders[shard]
        return [decode(opened.sample(row)) for row in checked]

    def _records(self, shard: int, rows: Iterable[int]) -> Iterator[dict[str, Any]]:
        opened: _Shard | None = None
        decode = self._decoders[shard]
        for row in rows:
            if opened is None:
                opened = self._shard(shard)
            yield decode(opened.sample(row))

    def _shard(self, shard: int) -> _Shard:
        # A reader still iterating a shard dropped from ``_open`` keeps its own reference.
        return self._open.get(shard, lambda: self._map(shard))

    def _map(self, shard: int) -> _Shard:
        info = self._shards_info[shard]
        raw = info.get("raw_data") or {}
        path = self.directory / str(raw.get("basename", ""))
        if not raw or not path.is_file():
            zipped = info.get("zip_data") or {}
            hint = (
                f"it is compressed ({info.get('compression')}, {zipped.get('basename')}): "
                "write the dataset with compression=None"
                if zipped
                else "copy the whole dataset folder"
            )
            raise FileNotFoundError(f"MDS shard {shard} has no file {path}; {hint}")
        return _Shard(path, raw.get("bytes"), int(info["samples"]))

    def length(self, record: Any) -> int:
        """The size of ``record`` in tokens (the ``length`` column or function).

        Args:
            record: a record of this source.
        """
        return record_length(record, self._length)

    @property
    def lengths_without_records(self) -> bool:
        """Whether ``read_lengths`` reads the lengths from the shards' bytes without
        decoding records: ``length`` names a column encoded as ``ndarray`` (its first
        dimension), ``int`` or ``bytes`` in every shard."""
        return all(column is not None for column in self._length_columns)

    def read_lengths(self, shard: int, start: int, count: int) -> np.ndarray:
        """``length`` of the records of rows ``start .. start + count - 1`` of ``shard``, as
        ``int64``: read from the samples' headers in a few array operations where
        ``lengths_without_records`` holds (no record is decoded), else from the decoded
        records; the same values either way.

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row.
            count: the rows, ``start + count <= shard_size(shard)``.
        """
        check_span(shard, start, count, self.shard_size(shard))
        column = self._length_columns[shard]
        if count and column is not None:
            opened = self._shard(shard)
            lengths = column.lengths(opened.bytes, opened.offsets[start : start + count + 1])
            if lengths is not None:
                return lengths
        return record_lengths(list(self._records(shard, range(start, start + count))), self._length)

    def block_lengths(self, records: Sequence[Any]) -> np.ndarray:
        """``length`` of every record of a block, as ``int64`` (``record_lengths``).

        Args:
            records: records of this source.
        """
        return record_lengths(records, self._length)

    def __getstate__(self) -> dict[str, Any]:
        # Codecs do not pickle (mapped files are left out by RecentlyUsed); a copy (e.g. in
        # a worker process) builds its own from the index it carries.
        return {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("_layouts", "_decoders", "_length_columns")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derive()

    def __repr__(self) -> str:
        return (
            f"MDSSource({str(self.directory)!r}, length={length_label(self._length)!r}, "
            f"columns={self.columns!r}, num_shards={self.num_shards})"
        )


def _dataset_folder(directory: Any) -> Path:
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory={directory!r} must be a path (str or pathlib.Path)")
    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"directory={str(directory)!r} is not a folder; point it at the local folder "
            "holding the MDS dataset's index.json (MDSWriter's out)"
        )
    if not (folder / INDEX).is_file():
        raise FileNotFoundError(
            f"directory={str(directory)!r} has no {INDEX}; point it at the folder MDSWriter "
            "wrote (a split's subfolder if the dataset has splits)"
        )
    return folder


def _read_index(folder: Path) -> dict[str, Any]:
    index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    if not isinstance(index, dict) or index.get("version") != 2:
        version = index.get("version") if isinstance(index, dict) else None
        raise ValueError(
            f"{folder / INDEX} has version {version!r}; MDSSource reads index version 2 "
            "(mosaicml-streaming >= 0.1); write the dataset again with a current MDSWriter"
        )
    if not index.get("shards"):
        raise ValueError(f"{folder / INDEX} lists no shards; the dataset is empty")
    return index


def write_mds(
    directory: str | os.PathLike[str],
    shards: Sequence[Sequence[Mapping[str, Any]]],
    columns: Mapping[str, str],
) -> None:
    """Write ``shards`` as an uncompressed MDS dataset in ``directory``: ``index.json`` and
    ``shard.NNNNN.mds`` files in the layout ``MDSWriter`` writes (which its readers and
    ``MDSSource`` read), shard ``s`` holding the records ``shards[s]`` in order.

    Args:
        directory: the folder written (created if missing; it must not hold an index.json).
        shards: one sequence of records (``{column: value}``) per shard.
        columns: every column's MDS encoding (e.g. ``{"tokens": "ndarray:int32"}``).

    Example::

        >>> write_mds("out", [[{"text": "hello", "n": 5}]], {"text": "str", "n": "int"})
    """
    folder = Path(directory)
    if (folder / INDEX).exists():
        raise ValueError(f"directory={str(directory)!r} already holds an {INDEX}; pick a new one")
    if not isinstance(columns, Mapping) or not columns:
        raise TypeError("columns must map every column name to its MDS encoding")
    names = sorted(columns)
    codecs = [codec(columns[name]) for name in names]
    config = {
        "column_encodings": [columns[name] for name in names],
        "column_names": names,
        "column_sizes": [c.size for c in codecs],
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": None,
        "version": 2,
    }
    config_bytes = json.dumps(config, sort_keys=True).encode("utf-8")
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for s, records in enumerate(shards):
        samples = [encode_sample(dict(record), codecs, names) for record in records]
        data = shard_header(len(samples), config_bytes, [len(b) for b in samples])
        data += b"".join(samples)
        basename = f"shard.{s:05d}.mds"
        (folder / basename).write_bytes(data)
        raw = {"basename": basename, "bytes": len(data), "hashes": {}}
        entries.append({**config, "raw_data": raw, "samples": len(samples), "zip_data": None})
    index = {"shards": entries, "version": 2}
    (folder / INDEX).write_text(json.dumps(index, sort_keys=True), encoding="utf-8")
