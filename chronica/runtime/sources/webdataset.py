"""WebDataset tar shards, read with the standard library's ``tarfile``.

The WebDataset convention: a sample is the run of consecutive files of a tar that share a
key, the file's path up to the first dot of its name (``train/000123.tokens.npy`` has key
``train/000123`` and field ``tokens.npy``, lowercased); directories, files without a dot
and metadata files (``__...__``) are skipped; a field repeated within a sample is an error.
A record is ``{"__key__": key, field: value, ...}`` as the ``webdataset`` package groups
it; with ``decode=True`` the fields whose last extension is standard are decoded as
``webdataset``'s default decoder does (``json``, ``npy``, ``txt``/``text``, ``cls``/
``cls2``/``index``/``id``), the others stay ``bytes``.

A shard's samples are counted by one scan of its tar headers (cached): for an uncompressed
``.tar`` the scan also records where every file's bytes lie, so a read from row ``r``
seeks there and ``read_rows`` reads only the rows asked for (random access, as the
package's indexed ``wids`` reader does). A compressed tar (``.tar.gz``, ``.tgz``) is read
in order only: a read from row ``r`` decompresses and drops the rows before it, and there
is no random access (the streaming engine then moves records between ranks).
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from chronica.runtime.sources.base import (
    check_length,
    check_length_kept,
    check_names,
    check_rows,
    check_shard,
    check_start,
    length_label,
    no_random_access,
    record_length,
    record_lengths,
    shard_paths,
)

__all__ = ["WebDatasetSource", "decode_field", "split_name"]

PLAIN = (".tar",)
COMPRESSED = (".tar.gz", ".tgz")
META = re.compile(r"__[^/]*__($|/)")


def split_name(name: str) -> tuple[str, str] | None:
    """A tar member's ``(key, field)`` by the WebDataset convention, or ``None`` for a name
    without an extension or a metadata name (``__...__``), which belong to no sample.

    Args:
        name: the member's path in the tar.

    Example::

        >>> split_name("train/000123.tokens.NPY"), split_name("README")
        (('train/000123', 'tokens.npy'), None)
    """
    if META.match(name):
        return None
    folder, _, base = name.rpartition("/")
    stem, dot, extensions = base.partition(".")
    if not dot or not stem or not extensions:
        return None
    return (f"{folder}/{stem}" if folder else stem), extensions.lower()


def decode_field(field: str, data: bytes) -> Any:
    """``data`` decoded by the last extension of ``field`` (``json``: the JSON value,
    ``npy``: the numpy array, ``txt``/``text``: ``str``, ``cls``/``cls2``/``index``/``id``:
    ``int``); other fields' bytes unchanged.

    Args:
        field: the field's name (the extensions, e.g. ``"tokens.npy"``).
        data: the file's bytes.

    Example::

        >>> decode_field("meta.json", b'{"n": 3}'), decode_field("img.jpg", b"...")
        ({'n': 3}, b'...')
    """
    extension = field.rpartition(".")[2]
    if extension == "json":
        return json.loads(data)
    if extension == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if extension in ("txt", "text"):
        return data.decode("utf-8")
    if extension in ("cls", "cls2", "index", "id"):
        return int(data)
    return data


@dataclass(frozen=True)
class _Index:
    """One shard's samples: keys, and for a plain tar where each sample's files lie."""

    keys: list[str]
    fields: list[list[tuple[str, int, int]]]  # (field, offset of the data, size) per file


class WebDatasetSource:
    """WebDataset tar shards (the files of a folder or a list), one shard per tar, as a
    ``ShardedSource``; random access where every tar is uncompressed.

    Guarantees: ``shard_size`` is the number of samples the WebDataset convention groups
    in the tar (one scan of its headers, cached); ``read(s, start)`` yields the samples
    from ``start`` in tar order, equal to what the ``webdataset`` package yields for the
    shard (fields ``__key__`` and the files' fields; ``__url__`` is not added); for
    uncompressed tars ``read_rows`` equals ``read`` at those rows. Memory: the index of the
    shards scanned (a key and one entry per file) and one sample at a time.

    Args:
        files: the folder holding the shards (``.tar``, ``.tar.gz``, ``.tgz``; sorted by
            name) or a list of tar files; one shard per file.
        length: a record's size in tokens: the name of a field holding the tokens (decoded,
            e.g. ``"tokens.npy"`` or ``"tokens.json"``) or the length (e.g. ``"len.cls"``),
            or a function of the record.
        decode: whether to decode the standard extensions (``decode_field``); ``False``
            keeps every field's bytes.
        fields: the fields kept in a record besides ``__key__`` (``None``: all).

    Example::

        >>> import io, tarfile
        >>> with tarfile.open("shard-0.tar", "w") as tar:
        ...     for key, text in (("a", b"[1, 2]"), ("b", b"[3]")):
        ...         info = tarfile.TarInfo(f"{key}.tokens.json"); info.size = len(text)
        ...         tar.addfile(info, io.BytesIO(text))
        >>> source = WebDatasetSource(["shard-0.tar"], length="tokens.json")
        >>> source.shard_size(0), source.read_rows(0, [1])
        (2, [{'__key__': 'b', 'tokens.json': [3]}])
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        length: str | Callable[[Any], int],
        decode: bool = True,
        fields: Sequence[str] | None = None,
    ) -> None:
        self.files = shard_paths(files, PLAIN + COMPRESSED)
        unknown = [p for p in self.files if not p.name.endswith(PLAIN + COMPRESSED)]
        if unknown:
            raise ValueError(f"files names {unknown}, not tar shards (.tar, .tar.gz, .tgz)")
        self._length = check_length(length)
        self.decode = bool(decode)
        self.fields = check_names("fields", fields)
        if self.fields is not None:
            check_length_kept(self._length, self.fields, "fields")
        self._indexes: dict[int, _Index] = {}

    @property
    def random_access(self) -> bool:
        """Whether every shard is an uncompressed tar (read by seeking)."""
        return all(path.name.endswith(PLAIN) for path in self.files)

    @property
    def num_shards(self) -> int:
        """How many tar files the source reads."""
        return len(self.files)

    def _index(self, shard: int) -> _Index:
        if shard not in self._indexes:
            self._indexes[shard] = _scan(self.files[shard])
        return self._indexes[shard]

    def shard_size(self, shard: int) -> int:
        """The number of samples of tar ``shard`` (one scan of its headers, cached).

        Args:
            shard: a shard in ``[0, num_shards)``.
        """
        return len(self._index(check_shard(shard, self.num_shards)).keys)

    def read(self, shard: int, start: int = 0) -> Iterator[dict[str, Any]]:
        """The samples of tar ``shard`` in order from row ``start``.

        Args:
            shard: a shard in ``[0, num_shards)``.
            start: the first row read, in ``[0, shard_size(shard)]``.
        """
        start = check_start(start, self.shard_size(shard))
        if self.files[shard].name.endswith(PLAIN):
            return self._seek_rows(shard, range(start, self.shard_size(shard)))
        return islice(self._stream(shard), start, None)

    def read_rows(self, shard: int, rows: Sequence[int]) -> list[dict[str, Any]]:
        """The samples of tar ``shard`` at ``rows``, in the order of ``rows`` (uncompressed
        tars only).

        Args:
            shard: a shard in ``[0, num_shards)``.
            rows: rows in ``[0, shard_size(shard))``.
        """
        checked = check_rows(rows, self.shard_size(shard))
        if not self.files[shard].name.endswith(PLAIN):
            raise no_random_access(self)
        return list(self._seek_rows(shard, checked))

    def _seek_rows(self, shard: int, rows: Sequence[int]) -> Iterator[dict[str, Any]]:
        index = self._index(shard)
        if not rows:
            return
        with open(self.files[shard], "rb") as file:
            for row in rows:
                values = []
                for field, offset, size in index.fields[row]:
                    file.seek(offset)
                    values.append((field, file.read(size)))
                yield self._record(index.keys[row], values)

    def _stream(self, shard: int) -> Iterator[dict[str, Any]]:
        with tarfile.open(self.files[shard], "r|*") as tar:

            def take(member: tarfile.TarInfo) -> bytes:
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file
                return extracted.read()

            for key, values in _samples(tar, take, self.files[shard]):
                yield self._record(key, values)

    def _record(self, key: str, values: list[tuple[str, bytes]]) -> dict[str, Any]:
        record: dict[str, Any] = {"__key__": key}
        for field, data in values:
            if self.fields is None or field in self.fields:
                record[field] = decode_field(field, data) if self.decode else data
        return record

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
            f"WebDatasetSource({folder!r}, num_shards={self.num_shards}, length={length!r}, "
            f"decode={self.decode}, fields={self.fields!r})"
        )


def _samples(
    tar: tarfile.TarFile, take: Callable[[tarfile.TarInfo], Any], path: Path
) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    """The tar's members grouped into samples by the WebDataset convention, in order, each
    member as ``take(member)`` (called as the member is reached: a stream cannot go back)."""
    key: str | None = None
    members: list[tuple[str, Any]] = []
    for member in tar:
        parts = split_name(member.name) if member.isreg() else None
        tar.members = []  # type: ignore[attr-defined]  # a stream keeps no list of what it passed
        if parts is None:
            continue
        if parts[0] != key:
            if key is not None:
                yield key, members
            key, members = parts[0], []
        if any(field == parts[1] for field, _ in members):
            raise ValueError(
                f"{path}: {member.name} repeats field {parts[1]!r} of sample {key!r}; "
                "the files of one sample need distinct extensions"
            )
        members.append((parts[1], take(member)))
    if key is not None:
        yield key, members


def _scan(path: Path) -> _Index:
    keys, fields = [], []
    with tarfile.open(path, "r|*") as tar:
        for key, members in _samples(tar, lambda m: (m.offset_data, m.size), path):
            keys.append(key)
            fields.append([(field, offset, size) for field, (offset, size) in members])
    return _Index(keys, fields)
