"""Mosaic Streaming's MDS format (index version 2), read and written without the package.

The layout, as ``mosaicml-streaming`` writes it (``MDSWriter``) and documents it:

- ``index.json`` in the dataset's folder: ``{"version": 2, "shards": [...]}``, one entry per
  shard with its ``column_names`` (sorted), ``column_encodings``, ``column_sizes`` (bytes
  of a fixed-size column, ``null`` for a variable one), ``samples``, ``raw_data``
  (``basename`` and ``bytes`` of the uncompressed file), ``compression`` and ``zip_data``
  (the compressed file, when the writer compressed);
- a shard file: ``uint32`` sample count ``n``, ``n + 1`` ``uint32`` offsets (absolute
  positions of each sample's bytes and of the end), the writer's configuration as JSON,
  then the samples back to back;
- a sample: one ``uint32`` size per variable-size column, in column order, then every
  column's bytes in column order.

This module decodes (and, for tests, documentation and benchmarks, encodes) the columns a
token stream uses: ``bytes``, ``str``, ``int``, numpy scalars (``uint8`` .. ``float64``),
``ndarray[:dtype[:shape]]``, ``str_int``, ``str_float``, ``str_decimal``, ``json`` and,
only when allowed, ``pkl``. Image encodings (``pil``, ``jpeg``, ``png`` and their lists)
are not decoded: leave such columns out of the read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Literal

import numpy as np

__all__ = [
    "ColumnCodec",
    "LengthColumn",
    "SampleDecoder",
    "codec",
    "decode_sample",
    "encode_sample",
    "length_column",
    "shard_header",
]

SCALARS = frozenset(
    ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16")
) | {"float32", "float64"}
# ndarray's value dtypes and shape dtypes, by the byte that names them in a sample.
ARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32"}
ARRAY_DTYPES |= {33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
ARRAY_CODES = {name: code for code, name in ARRAY_DTYPES.items()}
SHAPE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
# The same, as numpy dtypes and as memoryview formats (native, as numpy's names are).
_ARRAY_NUMPY = {code: np.dtype(name) for code, name in ARRAY_DTYPES.items()}
_SHAPE_FORMATS: tuple[Literal["B", "H", "I", "Q"], ...] = ("B", "H", "I", "Q")
UNSAFE = ("pkl",)


class ColumnCodec:
    """How one MDS column's bytes become a value and back.

    Args:
        encoding: the column's encoding as ``index.json`` names it.
        size: bytes of every value (``None``: variable, stored per sample).
        decode: bytes (or a ``memoryview`` of them) to value; an array shares the
            buffer's memory, every other value is a copy.
        encode: value to bytes.
    """

    def __init__(
        self,
        encoding: str,
        size: int | None,
        decode: Callable[[bytes | memoryview], Any],
        encode: Callable[[Any], bytes],
    ) -> None:
        self.encoding = encoding
        self.size = size
        self.decode = decode
        self.encode = encode

    def __repr__(self) -> str:
        return f"ColumnCodec({self.encoding!r}, size={self.size})"


def codec(encoding: str) -> ColumnCodec:
    """The codec of an MDS column encoding; ``ValueError`` for one this reader does not
    decode: images, and ``pkl`` (unpickling runs code, which chronica never does).

    Args:
        encoding: the encoding as ``index.json`` names it (e.g. ``"ndarray:int32"``).

    Example::

        >>> column = codec("ndarray:int32")
        >>> column.decode(column.encode(np.arange(3, dtype=np.int32)))
        array([0, 1, 2], dtype=int32)
    """
    name, _, args = encoding.partition(":")
    if name == "bytes":
        return ColumnCodec(encoding, None, bytes, bytes)
    if name == "str":
        return ColumnCodec(encoding, None, lambda b: str(b, "utf-8"), lambda v: v.encode())
    if name == "int":
        return ColumnCodec(
            encoding, 8, lambda b: int(np.frombuffer(b, np.int64)[0]), _scalar_bytes(np.int64)
        )
    if name in SCALARS:
        dtype = np.dtype(name)
        return ColumnCodec(
            encoding, dtype.itemsize, lambda b: np.frombuffer(b, dtype)[0], _scalar_bytes(dtype)
        )
    if name == "ndarray":
        return _array_codec(encoding, args)
    if name in ("str_int", "str_float", "str_decimal"):
        parse: Callable[[str], Any] = {"str_int": int, "str_float": float}.get(name, Decimal)
        return ColumnCodec(
            encoding, None, lambda b: parse(str(b, "utf-8")), lambda v: str(v).encode()
        )
    if name == "json":
        return ColumnCodec(encoding, None, lambda b: json.loads(str(b, "utf-8")), _json_bytes)
    if name in UNSAFE:
        raise ValueError(
            f"a column is encoded as {encoding!r}: unpickling runs code, and chronica never "
            "unpickles; leave the column out with columns=[...], or write it as json, "
            "ndarray or bytes"
        )
    raise ValueError(
        f"MDS encoding {encoding!r} is not decoded here (images are not); leave the column "
        "out of the columns read"
    )


def _scalar_bytes(dtype: Any) -> Callable[[Any], bytes]:
    return lambda value: np.asarray(value, dtype=dtype).tobytes()


def _json_bytes(value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value).encode("utf-8")


def _array_codec(encoding: str, args: str) -> ColumnCodec:
    dtype_text, _, shape_text = args.partition(":")
    dtype = dtype_text or None
    shape = tuple(int(d) for d in shape_text.split(",")) if shape_text else None
    if dtype is not None and dtype not in ARRAY_CODES:
        raise ValueError(f"MDS encoding {encoding!r} names dtype {dtype!r}, not one of MDS's")
    size = None
    if dtype is not None and shape is not None:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize

    value_type = None if dtype is None else np.dtype(dtype)

    def decode(data: bytes | memoryview) -> np.ndarray:
        at = 0
        value_dtype = value_type
        if value_dtype is None:
            value_dtype, at = _ARRAY_NUMPY[data[0]], 1
        array_shape = shape
        if array_shape is None:  # the dimensions as Python ints, read without numpy
            ndim, width = data[at] >> 2, data[at] & 3
            start, at = at + 1, at + 1 + ndim * 2**width
            array_shape = tuple(memoryview(data)[start:at].cast(_SHAPE_FORMATS[width]))
        return np.frombuffer(data, value_dtype, offset=at).reshape(array_shape)

    def encode(value: np.ndarray) -> bytes:
        parts = []
        if dtype is None:
            parts.append(bytes([ARRAY_CODES[value.dtype.name]]))
        if shape is None:
            dims = np.array(value.shape, np.int64)
            width = next(w for w, t in enumerate(SHAPE_DTYPES) if int(dims.max()) < 256 ** (2**w))
            parts.append(bytes([(value.ndim << 2) | width]))
            parts.append(dims.astype(SHAPE_DTYPES[width]).tobytes())
        parts.append(np.ascontiguousarray(value).tobytes())
        return b"".join(parts)

    return ColumnCodec(encoding, size, decode, encode)


class SampleDecoder:
    """Decodes the samples of one shard layout: ``decoder(data)`` is ``{column: value}``
    for the columns in ``wanted``, what ``decode_sample`` gives, with the layout's walk
    (which columns have a size up front, which are skipped) worked out once.

    Args:
        codecs: every column's codec, in the shard's column order.
        names: every column's name, in the same order.
        wanted: the columns decoded (the others are skipped, not decoded).

    Example::

        >>> codecs, names = [codec("str")], ["t"]
        >>> decode = SampleDecoder(codecs, names, frozenset(names))
        >>> decode(encode_sample({"t": "hi"}, codecs, names))
        {'t': 'hi'}
    """

    def __init__(self, codecs: list[ColumnCodec], names: list[str], wanted: frozenset[str]) -> None:
        self.names = list(names)
        self.wanted = wanted
        # (name or None: skipped, decode, size or None: the next size up front)
        steps = [
            (name if name in wanted else None, c.decode, c.size)
            for name, c in zip(names, codecs, strict=True)
        ]
        self._head = 4 * sum(c.size is None for c in codecs)
        self._steps = steps

    def __call__(self, data: bytes | memoryview) -> dict[str, Any]:
        """One sample's bytes (or a ``memoryview`` of them: ``ndarray`` columns are then
        views of that memory) as ``{column: value}``.

        Args:
            data: the sample's bytes (sizes of the variable columns, then the columns).
        """
        sizes = iter(memoryview(data)[: self._head].cast("I").tolist())
        at = self._head
        sample = {}
        for name, decode, fixed in self._steps:
            size = next(sizes) if fixed is None else fixed
            if name is not None:
                sample[name] = decode(data[at : at + size])
            at += size
        return sample

    def __repr__(self) -> str:
        return f"SampleDecoder(names={self.names}, wanted={sorted(self.wanted)})"


def decode_sample(
    data: bytes | memoryview,
    codecs: list[ColumnCodec],
    names: list[str],
    wanted: frozenset[str],
) -> dict[str, Any]:
    """One sample's bytes as ``{column: value}`` for the columns in ``wanted``
    (``SampleDecoder`` for one sample; a reader keeps one decoder per layout instead).

    Args:
        data: the sample's bytes (sizes of the variable columns, then the columns), or a
            ``memoryview`` of them (``ndarray`` columns are then views of that memory).
        codecs: every column's codec, in the shard's column order.
        names: every column's name, in the same order.
        wanted: the columns decoded (the others are skipped, not decoded).
    """
    return SampleDecoder(codecs, names, wanted)(data)


def encode_sample(sample: dict[str, Any], codecs: list[ColumnCodec], names: list[str]) -> bytes:
    """One sample as MDS bytes (the inverse of ``decode_sample`` over every column).

    Args:
        sample: ``{column: value}`` holding every column.
        codecs: every column's codec, in column order.
        names: every column's name, in the same order.
    """
    missing = [name for name in names if name not in sample]
    if missing:
        raise ValueError(f"a record lacks columns {missing}; every record needs all {names}")
    data = [column.encode(sample[name]) for name, column in zip(names, codecs, strict=True)]
    sizes = [len(d) for d, c in zip(data, codecs, strict=True) if c.size is None]
    return np.array(sizes, np.uint32).tobytes() + b"".join(data)


def shard_header(count: int, config: bytes, sample_sizes: list[int]) -> bytes:
    """The bytes of a shard file before its samples: count, offsets, configuration.

    Args:
        count: the number of samples.
        config: the writer's configuration as JSON bytes.
        sample_sizes: every sample's size in bytes, in order.
    """
    start = 4 + 4 * (count + 1) + len(config)
    offsets = np.concatenate([[0], np.cumsum(sample_sizes, dtype=np.int64)]) + start
    return np.uint32(count).tobytes() + offsets.astype(np.uint32).tobytes() + config


class LengthColumn:
    """Where a length column lies in a shard's samples, to read every sample's length from
    the shard's bytes in a few array operations, without decoding the sample: the first
    dimension of an ``ndarray`` column (``layout="shape"``: from its shape header; ``"fixed"``:
    a fixed shape's), an ``int`` column's value (``"int"``) or a ``bytes`` column's size
    (``"size"``): what ``len`` (or the integer) of the decoded value is.

    Args:
        layout: ``"shape"``, ``"fixed"``, ``"int"`` or ``"size"``.
        variables: variable-size columns in a sample (one ``uint32`` size each up front).
        fixed_before: bytes of the fixed-size columns before the column.
        sizes_before: the variable columns before it (their index among the variable ones).
        own: the column's index among the variable ones (``-1``: fixed size).
        detail: ``"shape"``: where the shape byte is (1 after a dtype byte, else 0);
            ``"fixed"``: the first dimension.
    """

    def __init__(
        self,
        layout: str,
        variables: int,
        fixed_before: int,
        sizes_before: list[int],
        own: int,
        detail: int = 0,
    ) -> None:
        self.layout, self.variables, self.fixed_before = layout, variables, fixed_before
        self.sizes_before, self.own, self.detail = sizes_before, own, detail

    def lengths(self, data: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
        """The lengths of the samples starting at ``offsets[:-1]`` (``uint8`` ``data`` is
        the shard file), or ``None`` where a sample holds a 0-d array (its length is its
        value: the caller decodes it).

        Args:
            data: the shard file's bytes.
            offsets: the samples' start offsets and the next one's (``uint32``).
        """
        at = offsets[:-1].astype(np.int64)
        if self.layout == "fixed":
            return np.full(at.shape[0], self.detail, np.int64)
        if self.layout == "size":
            return _unsigned(data, at + 4 * self.own, 4).astype(np.int64)
        column = at + 4 * self.variables + self.fixed_before
        for v in self.sizes_before:
            column += _unsigned(data, at + 4 * v, 4).astype(np.int64)
        if self.layout == "int":
            return _unsigned(data, column, 8).view(np.int64)
        head = data[column + self.detail]
        if not (head >> 2).all():  # a 0-d array: its length is its value
            return None
        width = (head & 3).astype(np.int64)
        return _unsigned(data, column + self.detail + 1, 1 << width).astype(np.int64)

    def __repr__(self) -> str:
        return f"LengthColumn({self.layout!r}, own={self.own}, before={self.sizes_before})"


def length_column(codecs: list[ColumnCodec], names: list[str], length: Any) -> LengthColumn | None:
    """The ``LengthColumn`` of ``length`` in a shard of these columns, or ``None`` where
    the length needs the decoded record (a function, or a column of another encoding).

    Args:
        codecs: every column's codec, in the shard's column order.
        names: every column's name, in the same order.
        length: the source's ``length`` argument (a column name or a function).

    Example::

        >>> length_column([codec("ndarray:int32")], ["tokens"], "tokens")
        LengthColumn('shape', own=0, before=[])
    """
    if not isinstance(length, str) or length not in names:
        return None
    j = names.index(length)
    variable = [c.size is None for c in codecs]
    preceding = sum(variable[:j])  # the variable-size columns before it
    fixed_before = sum(c.size or 0 for c in codecs[:j])
    own = preceding if variable[j] else -1
    name, _, args = codecs[j].encoding.partition(":")
    parts = (sum(variable), fixed_before, list(range(preceding)), own)
    if name == "int":
        return LengthColumn("int", *parts)
    if name == "bytes":
        return LengthColumn("size", *parts)
    if name != "ndarray":
        return None
    dtype_text, _, shape_text = args.partition(":")
    if shape_text:
        shape = [int(d) for d in shape_text.split(",")]
        return LengthColumn("fixed", *parts, detail=shape[0]) if shape else None
    return LengthColumn("shape", *parts, detail=0 if dtype_text else 1)


def _unsigned(data: np.ndarray, at: np.ndarray, width: Any) -> np.ndarray:
    """The little-endian unsigned integers of ``width`` bytes (one width, or one per
    value: 1, 2, 4 or 8) at positions ``at`` of ``data``, as ``uint64``."""
    value = np.zeros(at.shape[0], np.uint64)
    last = data.shape[0] - 1
    for i in range(int(np.max(width, initial=0))):
        byte = data[np.minimum(at + i, last)].astype(np.uint64) << np.uint64(8 * i)
        value |= byte if np.ndim(width) == 0 else np.where(i < width, byte, np.uint64(0))
    return value
